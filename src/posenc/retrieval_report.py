"""The report of a task comparison (``posenc.retrieval``): tables, plots, horizons and claims R1-R6.

Accuracy is the share of answers whose argmax is the target. A scheme whose in-distribution
accuracy (test ``id`` at the training length) is below ``learned`` (0.9) "did not learn the
task" and gets no horizon and no verdict. Its **retrieval horizon** is the largest evidence-
distance bucket of the controlled-gap test up to which every bucket's accuracy stays within
``horizon_tol`` (5 points) of its in-distribution accuracy (None: already the smallest bucket
falls short). Comparisons are over seeds, as in ``posenc.claims``, with the test sets'
sampling noise added: x <= y holds when max x <= min y, does not hold when min x exceeds max y
by more than two binomial standard errors, and is within noise otherwise.
"""

from __future__ import annotations

import csv
import io
import math
import re
from pathlib import Path
from typing import Optional

import numpy as np

from posenc.checkpoint import atomic_write_bytes
from posenc.claims import FAILS, FLAT_TOL, HOLDS, NOISE, Claim, Table, combine, role_names
from posenc.records import Ppl, Task, TaskCell, load, load_ppl
from posenc.report import seed_cell, with_ratios
from posenc.reporting import figure, log_scale, markdown_table, save_figure
from posenc.stamp import stamp_line
from posenc.taskeval import standard_error
from posenc.tasks import get_task

ROTATION_ONLY = ("rope", "acc-rand-qk", "acc-rand-qkv", "acc-learned-qkv")
FAR_MASS_CONTROLS = ("alibi", "forget", "rope+forget", "hybrid")
RAND_QKV, RAND_QK = "acc-rand-qkv", "acc-rand-qk"
REFLECTING = "path"  # Householder transports with beta in [0, 2]: a reflection flips a state, an SO(2) step of at most 1 rad cannot
# every scheme a task claim names: a run's scheme takes the role whose canonical spec it has (claims.role_names)
TASK_ROLES = list(dict.fromkeys([*ROTATION_ONLY, *FAR_MASS_CONTROLS, RAND_QKV, RAND_QK, REFLECTING, "path+forget"]))


def slug(task: str) -> str:
    """A file-name form of a task spec: ``mqar:pairs=8`` -> ``mqar-pairs-8``."""
    return re.sub(r"[^A-Za-z0-9.]+", "-", task).strip("-")


class Scores:
    """Answers, correct answers and NLL of one job, by (test, length, bucket)."""

    def __init__(self, cells: list[TaskCell]):
        self.cells = {(c.test, c.length, c.bucket): (c.n, c.correct, c.nll) for c in cells}

    def acc(self, test: str, length: Optional[int] = None, bucket: Optional[int] = None) -> tuple[Optional[float], int]:
        """(accuracy, answers) over the matching cells; (None, 0) when there are none."""
        sel = [v for (t, L, b), v in self.cells.items() if t == test and length in (None, L) and bucket in (None, b)]
        n = sum(v[0] for v in sel)
        return (sum(v[1] for v in sel) / n if n else None), n

    def lengths(self, test: str) -> list[int]:
        return sorted({L for t, L, _ in self.cells if t == test})

    def buckets(self, test: str) -> list[int]:
        return sorted({b for t, _, b in self.cells if t == test})


def horizon(curve: dict[int, float], id_acc: float, tol: float) -> Optional[int]:
    """Largest bucket up to which every bucket of ``curve`` ({bucket: accuracy}) is >= id_acc - tol; None if the first is not."""
    best = None
    for b in sorted(curve):
        if curve[b] < id_acc - tol:
            break
        best = b
    return best


class TaskTable:
    """One task's scores over schemes and seeds, with each job's in-distribution accuracy and horizon."""

    def __init__(self, records: list[Task], task: str, train_length: int, tol: float, bar: float):
        self.task, self.L0, self.tol, self.bar = task, train_length, tol, bar
        self.scores: dict[str, dict[int, Scores]] = {}  # only schemes with records: a lookup adds none
        mine = [r for r in records if r.task == task]
        name = role_names([r.scheme for r in mine], TASK_ROLES)
        for r in mine:
            self.scores.setdefault(name[r.scheme], {})[r.seed] = Scores(r.cells)
        self.seconds = {(name[r.scheme], r.seed): (r.train_seconds, r.eval_seconds) for r in mine}
        self.criterion = {(name[r.scheme], r.seed): (r.criterion, r.criterion_step, r.trained_steps) for r in mine if r.criterion}

    def id_acc(self, scheme: str) -> list[float]:
        return [s.acc("id", self.L0)[0] for s in self.scores.get(scheme, {}).values()]

    def seeds_learned(self, scheme: str) -> tuple[int, int]:
        """(seeds at or above the in-distribution bar, seeds)."""
        accs = self.id_acc(scheme)
        return sum(a is not None and a >= self.bar for a in accs), len(accs)

    def learned(self, scheme: str) -> bool:
        """Every seed at or above the in-distribution bar."""
        k, n = self.seeds_learned(scheme)
        return 0 < k == n

    def curve(self, scheme: str, seed: int, test: str = "gap") -> dict[int, float]:
        s = self.scores[scheme][seed]
        return {b: s.acc(test, bucket=b)[0] for b in s.buckets(test)}

    def horizons(self, scheme: str) -> list[Optional[int]]:
        return [horizon(self.curve(scheme, seed), s.acc("id", self.L0)[0], self.tol) for seed, s in self.scores[scheme].items()]

    def values(self, scheme: str, test: str, length: Optional[int] = None, bucket: Optional[int] = None) -> tuple[list[float], float]:
        """(accuracy per seed, the largest binomial standard error among them)."""
        pairs = [s.acc(test, length, bucket) for s in self.scores[scheme].values()]
        pairs = [(a, n) for a, n in pairs if a is not None]
        return [a for a, _ in pairs], max((standard_error(a, n) for a, n in pairs), default=float("nan"))


# ---------------------------------------------------------------- comparisons with sampling noise


def at_most(x: list[float], y: list[float], se: float) -> str:
    """x <= y over seeds: holds if max x <= min y, does not hold if min x > max y + 2 se, else within noise."""
    if max(x) <= min(y):
        return HOLDS
    return FAILS if min(x) > max(y) + 2 * se else NOISE


def above(x: list[float], t: float, se: float) -> str:
    """x > t over seeds: holds if min x > t + 2 se, does not hold if max x <= t, else within noise."""
    if min(x) > t + 2 * se:
        return HOLDS
    return FAILS if max(x) <= t else NOISE


def _pct(values: list[float]) -> str:
    if not values:
        return ""
    v = [100 * x for x in values]
    return f"{v[0]:.1f}" if len(v) == 1 else f"{np.mean(v):.1f} ± {(max(v) - min(v)) / 2:.1f}"


def _h(values: list[Optional[int]]) -> str:
    """Horizons over seeds: one value when they agree, else each seed's; "none": the smallest bucket already falls short."""
    shown = ["none" if h is None else str(h) for h in values]
    return shown[0] if len(set(shown)) == 1 else " / ".join(shown)


def _hval(h: Optional[int]) -> int:
    return 0 if h is None else h


# ---------------------------------------------------------------- claims


def read_text_results(run_dir: Path) -> list[Ppl]:
    """Perplexity records of a text comparison directory (``posenc.records.load_ppl``); [] when it has no results."""
    return load_ppl(run_dir) or []


def flat_schemes(text_records: list[Ppl]) -> dict[str, list[float]]:
    """{scheme: ratio per seed at the longest length} of the schemes flat (ratio <= 1 + FLAT_TOL) in a text run."""
    ppl = with_ratios(text_records)
    if not ppl:
        return {}
    t = Table(ppl, min(r.train_length for r in ppl))
    return {s: t.r(s, t.longest) for s in t.ratio if t.r(s, t.longest) and max(t.r(s, t.longest)) <= 1 + FLAT_TOL}


def claim_r1(t: TaskTable, flat: dict[str, list[float]]) -> Optional[Claim]:
    schemes = [s for s in flat if s in t.scores and t.learned(s)]
    if not schemes:
        return None
    beyond = {s: [_hval(h) > t.L0 for h in t.horizons(s)] for s in schemes}
    verdict = HOLDS if any(not any(v) for v in beyond.values()) else (FAILS if all(all(v) for v in beyond.values()) else NOISE)
    # the ratio as the text run's table shows it (mean ± half-range over seeds), not one seed's
    numbers = "; ".join(f"{s} (ratio {seed_cell(flat[s], '.3f')} at the longest length): horizon {_h(t.horizons(s))}" for s in schemes)
    return Claim("R1", f"{t.task}: flat perplexity is not far retrieval (some scheme flat in the text run has a horizon <= the training length {t.L0})", verdict, numbers)


def _rand_qkv_variants(t: TaskTable, windows: dict[str, Optional[float]]) -> list[tuple[float, str]]:
    return sorted((windows[s], s) for s in t.scores if (s == RAND_QKV or s.startswith(RAND_QKV + ":")) and "+" not in s and windows.get(s))


def claim_r2(t: TaskTable, windows: dict[str, Optional[float]]) -> Optional[Claim]:
    variants = [(w, s) for w, s in _rand_qkv_variants(t, windows) if t.learned(s)]
    if len(variants) < 2:
        return None
    within = [all(_hval(h) <= 4 * w for h in t.horizons(s)) for w, s in variants]
    exceeds = [all(_hval(h) > 4 * w for h in t.horizons(s)) for w, s in variants]
    order = [max(map(_hval, t.horizons(a))) <= min(map(_hval, t.horizons(b))) for (_, a), (_, b) in zip(variants, variants[1:])]
    reversed_ = [min(map(_hval, t.horizons(a))) > max(map(_hval, t.horizons(b))) for (_, a), (_, b) in zip(variants, variants[1:])]
    verdict = HOLDS if all(within) and all(order) else (FAILS if any(exceeds) or any(reversed_) else NOISE)
    numbers = "; ".join(f"{s}: w_0.01 {w:.0f}, horizon {_h(t.horizons(s))}" for w, s in variants)
    return Claim("R2", f"{t.task}: random accumulated rotations retrieve only within about their mixing window (horizon <= 4 w_0.01, growing with w)", verdict, numbers)


def claim_r3(t: TaskTable, windows: dict[str, Optional[float]]) -> Optional[Claim]:
    if not (t.learned(RAND_QK) and t.learned(RAND_QKV)) or not windows.get(RAND_QK):
        return None
    w = windows[RAND_QK]
    far = [b for b in next(iter(t.scores[RAND_QK].values())).buckets("gap") if b >= w]
    if not far:
        return None

    def mean_far(s):
        return [float(np.mean([t.curve(s, seed)[b] for b in far if b in t.curve(s, seed)])) for seed in t.scores[s]]

    qkv, qk = mean_far(RAND_QKV), mean_far(RAND_QK)
    se = max(t.values(s, "gap", bucket=far[0])[1] for s in (RAND_QK, RAND_QKV))
    return Claim("R3", f"{t.task}: beyond the mixing window ({w:.0f} tokens) Q/K/V retrieves no better than Q/K (value transport scrambles far content)",
                 at_most(qkv, qk, se), f"accuracy over gap buckets >= {far[0]}: acc-rand-qkv {_pct(qkv)}% vs acc-rand-qk {_pct(qk)}%")


NEAR = 16  # flip-flop near recall: answers whose evidence is fewer than NEAR tokens back


def near_values(t: TaskTable, s: str, length: int) -> tuple[list[float], float]:
    """Near-recall accuracy per seed at sequence ``length`` (and its standard error): the ``near`` test
    (mqar: the pairs right before the queries, after ``length`` tokens of filler), else the ``id`` test's
    answers with evidence < NEAR tokens back (flip-flop: near reads anywhere in a long sequence)."""
    first = next(iter(t.scores[s].values()))
    if first.lengths("near"):
        return t.values(s, "near", length)
    accs, se = [], 0.0
    for scores in t.scores[s].values():
        cells = [scores.acc("id", length, b) for b in scores.buckets("id") if b < NEAR]
        n = sum(c[1] for c in cells if c[0] is not None)
        acc = sum(c[0] * c[1] for c in cells if c[0] is not None) / n
        accs.append(acc)
        se = max(se, standard_error(acc, n))
    return accs, se


def claim_r4(t: TaskTable) -> Optional[Claim]:
    rot = [s for s in ROTATION_ONLY if t.learned(s)]
    ctrl = [s for s in FAR_MASS_CONTROLS if t.learned(s)]
    if not rot or not ctrl:
        return None
    first = next(iter(t.scores[rot[0]].values()))
    lengths = first.lengths("near") or first.lengths("id")
    near, far = lengths[0], lengths[-1]

    def drop(s):
        a, se_a = near_values(t, s, near)
        b, se_b = near_values(t, s, far)
        return [x - y for x, y in zip(a, b)], math.hypot(se_a, se_b)

    parts, numbers = [], []
    for s in rot + ctrl:
        d, se = drop(s)
        parts.append(above(d, t.tol, se) if s in rot else at_most(d, [t.tol], se))
        numbers.append(f"{s} {_pct(d)}")
    what = "the pairs right before the queries" if first.lengths("near") else f"reads whose write is < {NEAR} tokens back"
    return Claim("R4", f"{t.task}: near recall ({what}) in a long context ({near} -> {far} tokens) erodes (drop > {100 * t.tol:.0f} points) "
                 "for rotation-only schemes, not for ALiBi or forget-gate schemes", combine(parts), "accuracy drop in points: " + ", ".join(numbers))


def claim_r5(t: TaskTable) -> Optional[Claim]:
    if not all(t.learned(s) for s in ("path", "forget", "rope")):
        return None
    errs = {}
    for s in ("path", "forget", "rope"):
        acc, se = t.values(s, "sparse", t.L0)
        errs[s] = ([1 - a for a in acc], se)
    se = max(v[1] for v in errs.values())
    verdict = combine([at_most(errs["path"][0], errs[o][0], se) for o in ("forget", "rope")])
    return Claim("R5", f"{t.task}: PaTH errs at most as often as FoX and RoPE on the sparse test at the training length (the PaTH paper's order)",
                 verdict, ", ".join(f"{s} {_pct(v[0])}%" for s, v in errs.items()))




def claim_r6(t: TaskTable) -> Optional[Claim]:
    """State tracking (modsum): PaTH carries the running sum beyond the training length, no other learned scheme does.
    None (no verdict) when PaTH did not learn the task."""
    if not t.learned(REFLECTING):
        return None
    others = [s for s in t.scores if s != REFLECTING and t.learned(s)]
    beyond = {s: [_hval(h) > t.L0 for h in t.horizons(s)] for s in [REFLECTING] + others}
    if all(beyond[REFLECTING]) and not any(any(beyond[s]) for s in others):
        verdict = HOLDS
    elif not any(beyond[REFLECTING]) or any(all(beyond[s]) for s in others):
        verdict = FAILS
    else:
        verdict = NOISE
    unlearned = [s for s in t.scores if s != REFLECTING and not t.learned(s)]
    numbers = "horizon: " + ", ".join(f"{s} {_h(t.horizons(s))}" for s in [REFLECTING] + others)
    numbers += f"; did not learn: {', '.join(unlearned)}" if unlearned else ""
    return Claim("R6", f"{t.task}: state tracking beyond the training length {t.L0}: PaTH's horizon exceeds it and no other "
                 "learned scheme's does (a reflection can flip a state; SO(2) steps of at most 1 rad and position biases cannot)", verdict, numbers)


def check_task_claims(t: TaskTable, meta: dict, text_records: list[Ppl]) -> list[Claim]:
    windows = meta.get("mixing_windows") or {}
    out = [claim_r1(t, flat_schemes(text_records)), claim_r2(t, windows), claim_r3(t, windows), claim_r4(t)]
    kind = t.task.partition(":")[0]
    if kind == "flipflop":
        out.append(claim_r5(t))
    if kind == "modsum":
        out.append(claim_r6(t))
    return [c for c in out if c is not None]


# ---------------------------------------------------------------- tables and plots


def _seeds_learned(t: TaskTable, s: str) -> str:
    """"" when no seed or every seed learned, else "(k of n seeds learned)": a scheme that learns on some
    seeds only has still not learned the task at this budget, but it is not the same as never."""
    k, n = t.seeds_learned(s)
    return f" ({k} of {n} seeds learned)" if 0 < k < n else ""


def _status(t: TaskTable, s: str) -> str:
    return "yes" if t.learned(s) else "**did not learn**" + _seeds_learned(t, s)


def accuracy_markdown(t: TaskTable, schemes: list[str]) -> str:
    first = next(iter(t.scores[schemes[0]].values()))
    cols = [(test, L) for test in ("id", "sparse", "dense", "near") for L in first.lengths(test)]
    header = ["scheme", "learned"] + [f"{test} {L // t.L0 if L % t.L0 == 0 else L / t.L0:g}x" for test, L in cols]
    rows = [[s, _status(t, s)] + [_pct(t.values(s, test, L)[0]) for test, L in cols] for s in schemes]
    counts = [f"{test} {L}: {first.acc(test, L)[1]}" for test, L in cols]
    return markdown_table(header, rows) + f"\n\nAnswers per cell (one seed): {', '.join(counts)}."


def distance_markdown(t: TaskTable, schemes: list[str], windows: dict) -> str:
    first = next(iter(t.scores[schemes[0]].values()))
    buckets = first.buckets("gap")
    header = ["scheme", "w_0.01", "id 1x"] + [str(b) for b in buckets] + ["horizon"]
    rows = []
    for s in schemes:
        w = windows.get(s)
        rows.append([s, "" if w is None else f"{w:.0f}", _pct(t.id_acc(s))] + [_pct(t.values(s, "gap", bucket=b)[0]) for b in buckets]
                    + [_h(t.horizons(s)) if t.learned(s) else "no verdict (did not learn)" + _seeds_learned(t, s)])
    counts = ", ".join(f"{b}: {first.acc('gap', bucket=b)[1]}" for b in buckets)
    return markdown_table(header, rows) + f"\n\nAnswers per distance bucket (one seed): {counts}."


def criterion_markdown(t: TaskTable, schemes: list[str]) -> str:
    """Steps to criterion (``train.until``) per scheme: each seed's step, or "not reached (N steps)" at the cap, and
    the mean over the seeds that reached it."""
    rows = []
    for s in schemes:
        runs = [t.criterion[(s, seed)] for seed in sorted(t.scores[s]) if (s, seed) in t.criterion]
        reached = [step for _, step, _ in runs if step is not None]
        shown = [str(step) if step is not None else f"not reached ({trained} steps)" for _, step, trained in runs]
        rows.append([s, " / ".join(shown), f"{np.mean(reached):.0f}" if reached else "not reached",
                     f"{len(reached)} of {len(runs)}"])
    what = "; ".join(sorted({c for c, _, _ in t.criterion.values()}))
    return markdown_table(["scheme", "steps (each seed)", "mean over seeds that reached it", "reached"], rows) + f"\n\nCriterion: {what}."


def reference_markdown(t: TaskTable, ref: dict) -> str:
    """Our error (%) at the training length beside a published table ``ref`` ({source, tests, rows})."""
    tests = ref["tests"]
    header = ["scheme"] + [f"{test} (ours)" for test in tests] + [f"{test} ({ref['source']})" for test in tests]
    rows = []
    for s, theirs in ref["rows"].items():
        if s in t.scores:
            ours = [_pct([1 - a for a in t.values(s, test, t.L0)[0]]) for test in tests]
            rows.append([s] + ours + [f"{v:g}" for v in theirs])
    return markdown_table(header, rows)


def plot_distance(path: Path, t: TaskTable, schemes: list[str], windows: dict, chance: float) -> None:
    fig, ax = figure(figsize=(9.5, 4.5))
    colors = {s: f"C{i % 10}" for i, s in enumerate(schemes)}
    for s in schemes:
        curves = [t.curve(s, seed) for seed in t.scores[s]]
        buckets = sorted(curves[0])
        acc = [100 * np.mean([c[b] for c in curves if b in c]) for b in buckets]
        ax.plot(buckets, acc, marker="o", ms=3, color=colors[s], label=s + ("" if t.learned(s) else " (did not learn)"),
                ls="-" if t.learned(s) else ":")
        if windows.get(s):
            ax.axvline(windows[s], color=colors[s], ls=":", lw=1)
    ax.axvline(t.L0, color="black", ls="--", lw=1, label=f"training length {t.L0}")
    ax.axhline(100 * chance, color="grey", lw=1, label="chance")
    log_scale(ax, "x", base=2)
    ax.set_xlabel("evidence distance (tokens; dotted: the scheme's mixing window w_0.01)")
    ax.set_ylabel("accuracy (%)")
    ax.set_title(f"{t.task}: controlled-gap test")
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    save_figure(fig, path)


def plot_length(path: Path, t: TaskTable, schemes: list[str], chance: float) -> None:
    tests = [test for test in ("id", "sparse", "near") if next(iter(t.scores[schemes[0]].values())).lengths(test)]
    fig, axes = figure(1, len(tests), figsize=(4.5 * len(tests), 4), squeeze=False)
    for ax, test in zip(axes[0], tests):
        for i, s in enumerate(schemes):
            lengths = next(iter(t.scores[s].values())).lengths(test)
            ax.plot(lengths, [100 * np.mean(t.values(s, test, L)[0]) for L in lengths], marker="o", ms=3, color=f"C{i % 10}", label=s)
        ax.axvline(t.L0, color="black", ls="--", lw=1)
        ax.axhline(100 * chance, color="grey", lw=1)
        log_scale(ax, "x", base=2)
        ax.set_xlabel("sequence length (tokens)")
        ax.set_ylabel("accuracy (%)")
        ax.set_title(f"{t.task}: {test}")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    save_figure(fig, path)


def write_csv(path: Path, records: list[Task]) -> None:
    buf = io.StringIO()
    w = csv.writer(buf)
    w.writerow(["task", "scheme", "seed", "test", "length", "bucket", "answers", "correct", "accuracy", "nll_mean"])
    for r in records:
        for c in r.cells:
            w.writerow([r.task, r.scheme, r.seed, c.test, c.length, c.bucket, c.n, c.correct,
                        f"{c.correct / c.n:.4f}", f"{c.nll / c.n:.4f}"])
    atomic_write_bytes(path, buf.getvalue().encode())


def _times_line(seconds: list[tuple[float, float]]) -> str:
    """Training and evaluation time ranges over the jobs that recorded them (records rebuilt from a CSV keep none: NaN)."""
    timed = [v for v in seconds if not any(math.isnan(x) for x in v)]
    if not timed:
        return "Training and evaluation times were not recorded."
    of = f" ({len(timed)} of {len(seconds)} jobs recorded their times)" if len(timed) < len(seconds) else ""
    return (f"Training time per job: {min(v[0] for v in timed):.0f}-{max(v[0] for v in timed):.0f} s; "
            f"evaluation {min(v[1] for v in timed):.0f}-{max(v[1] for v in timed):.0f} s{of}.")


def write_task_report(run_dir: Path, meta: dict, failures: dict[str, str] | None = None) -> Path:
    """report.md, retrieval.csv and two plots per task (distance-*.png, length-*.png); returns report.md's path."""
    run_dir = Path(run_dir)
    records = [r for r in load(run_dir / "results.jsonl") if isinstance(r, Task)]
    write_csv(run_dir / "retrieval.csv", records)
    ev, L0, windows = meta["eval"], meta["train_length"], meta.get("mixing_windows") or {}
    text = meta.get("text_results")
    text_records = read_text_results(Path(text)) if text else []
    st = meta["stamp"]
    lines = [f"# posenc retrieval: {meta['name']}", "",
             f"- model: {meta['model']}", f"- budget: {meta['budget']}", f"- seeds: {meta['seeds']}",
             f"- evaluation: answers per cell {ev['answers']} (or {ev['max_tokens']} tokens), lengths {ev['multiples']} x {L0}; "
             f"learned: id accuracy >= {100 * ev['learned']:.0f}%; horizon: accuracy within {100 * ev['horizon_tol']:.0f} points of id",
             f"- run: {stamp_line(st)} (each invocation: `invocations.jsonl`; each job's threads: its record)",
             f"- noise: a comparison is over seeds ({len(meta['seeds'])}) plus two binomial standard errors of the test sets; "
             + ("one seed does not measure training noise (thread count changes learned schemes' weights)" if len(meta["seeds"]) == 1 else "the seed range is the training noise"),
             ""]
    if meta.get("notes"):
        lines += [meta["notes"], ""]
    lines += meta.get("sweep") or []  # posenc.sweep.sweep_markdown: each scheme's chosen setting and the sensitivity table
    claims = []
    # every task the run holds: a task added by an earlier invocation (--tasks X, then --tasks Y) keeps its section
    tasks = {**meta["tasks"], **{r.task: get_task(r.task).describe() for r in records if r.task not in meta["tasks"]}}
    for task, desc in tasks.items():
        t = TaskTable(records, task, L0, ev["horizon_tol"], ev["learned"])
        schemes = [s for s in t.scores]
        lines += [f"## {task}", "", f"{desc}", ""]
        if not schemes:
            lines += ["No results yet.", ""]
            continue
        lines += ["### Accuracy (%) by test and sequence length", "", accuracy_markdown(t, schemes), ""]
        lines += ["### Accuracy (%) by evidence distance (controlled-gap test) and retrieval horizon", "", distance_markdown(t, schemes, windows), ""]
        if t.criterion:
            lines += ["### Steps to criterion", "", criterion_markdown(t, [s for s in schemes if any(k[0] == s for k in t.criterion)]), ""]
        lines += [_times_line(list(t.seconds.values())), ""]
        ref = meta.get("reference")
        if ref and ref.get("task", "flipflop") == task.partition(":")[0]:
            lines += [f"### Error (%) at the training length beside {ref['source']}", "", reference_markdown(t, ref), ""]
            if ref.get("note"):
                lines += [ref["note"], ""]
        chance = get_task(task).chance
        plot_distance(run_dir / f"distance-{slug(task)}.png", t, schemes, windows, chance)
        plot_length(run_dir / f"length-{slug(task)}.png", t, schemes, chance)
        claims += check_task_claims(t, meta, text_records)
    if claims:
        lines += ["## Claims", "", markdown_table(["claim", "verdict", "numbers"], [[f"({c.key}) {c.text}", f"**{c.verdict}**", c.evidence] for c in claims]), ""]
    elif records:
        lines += ["## Claims", "", "No claim gets a verdict: the schemes each one compares did not all learn the task on every seed.", ""]
    if text and not text_records:
        lines += [f"(R1 needs the text comparison {text} (results.jsonl or results.csv): not found.)", ""]
    if failures:
        lines += ["## Failed jobs", ""] + [f"- {k}: {v}" for k, v in failures.items()] + [""]
    path = run_dir / "report.md"
    atomic_write_bytes(path, "\n".join(lines).encode())
    return path
