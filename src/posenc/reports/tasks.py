"""The report of a task comparison (``posenc.runs.retrieval``): tables, plots, horizons and claims R1-R6.

Accuracy is the share of answers whose argmax is the target. A scheme whose in-distribution
accuracy (test ``id`` at the training length) is below ``learned`` (0.9) "did not learn the
task" and gets no horizon and no verdict. Its **retrieval horizon** is the largest evidence-
distance bucket of the controlled-gap test up to which every bucket's accuracy stays within
``horizon_tol`` (5 points) of its in-distribution accuracy (None: already the smallest bucket
falls short). Comparisons are over seeds, as in ``posenc.reports.claims``, with the test sets'
sampling noise added: x <= y holds when max x <= min y, does not hold when min x exceeds max y
by more than two binomial standard errors, and is within noise otherwise. A claim whose schemes were
run but did not all learn is **undecided**: its evidence names each scheme that did not learn, on which seeds
(their id accuracy), and what that job's learning curve says about the budget that would decide it
(:func:`budget`). Claims whose schemes were not run are omitted.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import numpy as np

from posenc.data.tasks import get_task
from posenc.encodings.bias import alibi_slopes
from posenc.eval.tasks import standard_error
from posenc.reports.claims import FAILS, FLAT_TOL, HOLDS, NOISE, Claim, Table, combine, role_names
from posenc.reports.compare import with_ratios
from posenc.reports.render import figure, log_scale, markdown_table, plot_lines, save_figure, seed_cell, write_csv_table
from posenc.store.checkpoint import atomic_write_bytes
from posenc.store.records import Ppl, Task, TaskCell, load, load_ppl
from posenc.store.stamp import stamp_line

ROTATION_ONLY = ("rope", "acc-rand-qk", "acc-rand-qkv", "acc-learned-qkv")
FAR_MASS_CONTROLS = ("alibi", "forget", "rope+forget", "hybrid")
RAND_QKV, RAND_QK = "acc-rand-qkv", "acc-rand-qk"
# Householder transports with beta in [0, 2]: a reflection flips a state, an SO(2) step of at most 1 rad cannot
REFLECTING = "path"
ALIBI = "alibi"
FORGET_GATES = ("forget", "rope+forget", "path+forget")  # the schemes whose jobs measure the gate's leak (Task.leak)
# every scheme a task claim names: a run's scheme takes the role whose canonical spec it has (claims.role_names)
TASK_ROLES = list(dict.fromkeys([*ROTATION_ONLY, *FAR_MASS_CONTROLS, RAND_QKV, RAND_QK, REFLECTING, *FORGET_GATES]))
UNDECIDED = "undecided"
# budget(): the training loss "still falls" when the mean of its last eighth of logged steps is more than LOSS_FALLING
# (relative) below the same-sized window a quarter of the steps earlier; it is "at chance" from AT_CHANCE x -ln(chance)
LOSS_FALLING, AT_CHANCE = 0.05, 0.95
# R7, R8: a distance bias of r nats per token reaches WINDOW_NATS at w = WINDOW_NATS / r (a key's weight down by e);
# a horizon "follows" w within HORIZON_FACTOR either way (horizons are powers of two: two buckets each side)
WINDOW_NATS, HORIZON_FACTOR = 1.0, 4.0


def slug(task: str) -> str:
    """A file-name form of a task spec: ``mqar:pairs=8`` -> ``mqar-pairs-8``."""
    return re.sub(r"[^A-Za-z0-9.]+", "-", task).strip("-")


class Scores:
    """Answers, correct answers and NLL of one job, by (test, length, bucket)."""

    def __init__(self, cells: list[TaskCell]):
        self.cells = {(c.test, c.length, c.bucket): (c.n, c.correct, c.nll) for c in cells}

    def acc(self, test: str, length: int | None = None, bucket: int | None = None) -> tuple[float | None, int]:
        """(accuracy, answers) over the matching cells; (None, 0) when there are none."""
        sel = [v for (t, L, b), v in self.cells.items() if t == test and length in (None, L) and bucket in (None, b)]
        n = sum(v[0] for v in sel)
        return (sum(v[1] for v in sel) / n if n else None), n

    def lengths(self, test: str) -> list[int]:
        return sorted({L for t, L, _ in self.cells if t == test})

    def buckets(self, test: str) -> list[int]:
        return sorted({b for t, _, b in self.cells if t == test})


def horizon(curve: dict[int, float], id_acc: float, tol: float) -> int | None:
    """Largest bucket up to which every bucket of ``curve`` ({bucket: accuracy}) is >= id_acc - tol; None if the first
    is not."""
    best = None
    for b in sorted(curve):
        if curve[b] < id_acc - tol:
            break
        best = b
    return best


class TaskTable:
    """One task's scores over schemes and seeds, with each job's in-distribution accuracy and horizon."""

    def __init__(
        self, records: list[Task], task: str, train_length: int, tol: float, bar: float, n_head: int | None = None
    ):
        """``n_head``: the run's head count for records without their own (``Task.n_head``); None: unknown."""
        self.task, self.L0, self.tol, self.bar = task, train_length, tol, bar
        self.chance = get_task(task).chance
        self.scores: dict[str, dict[int, Scores]] = {}  # only schemes with records: a lookup adds none
        self.records: dict[tuple[str, int], Task] = {}
        mine = [r for r in records if r.task == task]
        name = role_names([r.scheme for r in mine], TASK_ROLES)
        for r in mine:
            self.scores.setdefault(name[r.scheme], {})[r.seed] = Scores(r.cells)
            self.records[(name[r.scheme], r.seed)] = (
                r if r.n_head is not None else r.model_copy(update={"n_head": n_head})
            )
        # each scheme's seeds in seed order: the records come in the order the jobs finished (--parallel)
        self.scores = {s: dict(sorted(by_seed.items())) for s, by_seed in self.scores.items()}
        self.seconds = {(name[r.scheme], r.seed): (r.train_seconds, r.eval_seconds) for r in mine}
        self.criterion = {
            (name[r.scheme], r.seed): (r.criterion, r.criterion_step, r.trained_steps) for r in mine if r.criterion
        }

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

    def horizons(self, scheme: str) -> list[int | None]:
        return [
            horizon(self.curve(scheme, seed), s.acc("id", self.L0)[0], self.tol)
            for seed, s in self.scores[scheme].items()
        ]

    def censored(self, scheme: str) -> list[bool]:
        """Per seed: the horizon is the largest distance probed (the true one may lie beyond)."""
        return [
            h is not None and h == max(self.curve(scheme, seed))
            for seed, h in zip(self.scores[scheme], self.horizons(scheme))
        ]

    def values(
        self, scheme: str, test: str, length: int | None = None, bucket: int | None = None
    ) -> tuple[list[float], float]:
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


def _h(values: list[int | None]) -> str:
    """Horizons over seeds: one value when they agree, else each seed's; "none": the smallest bucket already falls
    short."""
    shown = ["none" if h is None else str(h) for h in values]
    return shown[0] if len(set(shown)) == 1 else " / ".join(shown)


def _hval(h: int | None) -> int:
    return 0 if h is None else h


# ---------------------------------------------------------------- claims


def read_text_results(run_dir: Path) -> list[Ppl]:
    """Perplexity records of a text comparison directory (``posenc.store.records.load_ppl``); [] when it has no
    results."""
    return load_ppl(run_dir) or []


def flat_schemes(text_records: list[Ppl]) -> dict[str, list[float]]:
    """{scheme: ratio per seed at the longest length} of the schemes flat (ratio <= 1 + FLAT_TOL) in a text run."""
    ppl = with_ratios(text_records)
    if not ppl:
        return {}
    t = Table(ppl, min(r.train_length for r in ppl))
    return {s: t.r(s, t.longest) for s in t.ratio if t.r(s, t.longest) and max(t.r(s, t.longest)) <= 1 + FLAT_TOL}


def budget(record: Task, chance: float) -> str:
    """What a job's learning curve (``Task.loss_curve``) says about the budget that would decide a claim it did not
    learn for: the training loss still falling at the step cap (LOSS_FALLING): more steps; flat at chance (AT_CHANCE x
    -ln ``chance``): more steps alone are unlikely to help, another learning rate or head count; flat below chance
    (learned part of the task): another setting. "no loss curve in the records" when the record keeps fewer than 4
    logged steps (records before ``Task.loss_curve``)."""
    curve = record.loss_curve or []
    if len(curve) < 4:
        return "no loss curve in the records"
    steps, loss = [s for s, _ in curve], [v for _, v in curve]
    cap, k = record.trained_steps or steps[-1], max(1, len(curve) // 8)
    late = float(np.mean(loss[-k:]))
    i = max(j for j, s in enumerate(steps) if s <= steps[-1] - (steps[-1] - steps[0]) / 4)
    before = float(np.mean(loss[max(0, i - k + 1) : i + 1]))
    chance_loss = -math.log(chance)
    if late < before * (1 - LOSS_FALLING):
        return (
            f"loss still falling at the step cap {cap} "
            f"({before:.3f} -> {late:.3f} over its last {steps[-1] - steps[i]} steps): more steps"
        )
    if late >= AT_CHANCE * chance_loss:
        return (
            f"loss flat at chance at the step cap {cap} ({late:.3f}; ln {1 / chance:g} = {chance_loss:.3f}): "
            "more steps alone unlikely, another learning rate or head count"
        )
    return (
        f"loss flat at {late:.3f} at the step cap {cap} (chance {chance_loss:.3f}): "
        "another setting (learning rate, heads), not more steps"
    )


def not_learned(t: TaskTable, schemes: list[str]) -> str:
    """Why a claim over ``schemes`` is undecided: each of them that did not learn, the seeds below the bar with their
    in-distribution accuracy, grouped by what each job's learning curve says (:func:`budget`)."""
    parts = []
    for s in schemes:
        if s not in t.scores or t.learned(s):
            continue
        low: dict[str, list[tuple[int, float]]] = {}
        for seed, scores in sorted(t.scores[s].items()):
            acc = scores.acc("id", t.L0)[0]
            if acc is None or acc < t.bar:
                low.setdefault(budget(t.records[(s, seed)], t.chance), []).append((seed, acc or 0.0))
        parts.append(
            f"{s} did not learn on "
            + "; ".join(
                f"seed{'s' * (len(v) > 1)} {', '.join(str(seed) for seed, _ in v)} "
                f"(id {' / '.join(f'{100 * a:.1f}' for _, a in v)}% "
                f"< {100 * t.bar:.0f}%: {why})"
                for why, v in low.items()
            )
        )
    return "; ".join(parts)


def _undecided(key: str, text: str, t: TaskTable, schemes: list[str]) -> Claim:
    return Claim(key, text, UNDECIDED, not_learned(t, schemes))


def claim_r1(t: TaskTable, flat: dict[str, list[float]]) -> Claim | None:
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
    beyond = {s: [_hval(h) > t.L0 for h in t.horizons(s)] for s in schemes}
    verdict = (
        HOLDS
        if any(not any(v) for v in beyond.values())
        else (FAILS if all(all(v) for v in beyond.values()) else NOISE)
    )
    # the ratio as the text run's table shows it (mean ± half-range over seeds), not one seed's
    numbers = "; ".join(
        f"{s} (ratio {seed_cell(flat[s], '.3f')} at the longest length): horizon {_h(t.horizons(s))}" for s in schemes
    )
    return Claim("R1", text, verdict, numbers)


def _rand_qkv_variants(t: TaskTable, windows: dict[str, float | None]) -> list[tuple[float, str]]:
    return sorted(
        (windows[s], s)
        for s in t.scores
        if (s == RAND_QKV or s.startswith(RAND_QKV + ":")) and "+" not in s and windows.get(s)
    )


def claim_r2(t: TaskTable, windows: dict[str, float | None]) -> Claim | None:
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
    within = [all(_hval(h) <= 4 * w for h in t.horizons(s)) for w, s in variants]
    exceeds = [all(_hval(h) > 4 * w for h in t.horizons(s)) for w, s in variants]
    order = [
        max(map(_hval, t.horizons(a))) <= min(map(_hval, t.horizons(b)))
        for (_, a), (_, b) in zip(variants, variants[1:])
    ]
    reversed_ = [
        min(map(_hval, t.horizons(a))) > max(map(_hval, t.horizons(b)))
        for (_, a), (_, b) in zip(variants, variants[1:])
    ]
    verdict = HOLDS if all(within) and all(order) else (FAILS if any(exceeds) or any(reversed_) else NOISE)
    numbers = "; ".join(f"{s}: w_0.01 {w:.0f}, horizon {_h(t.horizons(s))}" for w, s in variants)
    return Claim("R2", text, verdict, numbers)


def claim_r3(t: TaskTable, windows: dict[str, float | None]) -> Claim | None:
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

    def mean_far(s):
        return [float(np.mean([t.curve(s, seed)[b] for b in far if b in t.curve(s, seed)])) for seed in t.scores[s]]

    qkv, qk = mean_far(RAND_QKV), mean_far(RAND_QK)
    se = max(t.values(s, "gap", bucket=far[0])[1] for s in (RAND_QK, RAND_QKV))
    return Claim(
        "R3",
        text,
        at_most(qkv, qk, se),
        f"accuracy over gap buckets >= {far[0]}: acc-rand-qkv {_pct(qkv)}% vs acc-rand-qk {_pct(qk)}%",
    )


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


def claim_r4(t: TaskTable) -> Claim | None:
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

    def drop(s):
        a, se_a = near_values(t, s, near)
        b, se_b = near_values(t, s, far)
        return [x - y for x, y in zip(a, b)], math.hypot(se_a, se_b)

    parts, numbers = [], []
    for s in rot + ctrl:
        d, se = drop(s)
        parts.append(above(d, t.tol, se) if s in rot else at_most(d, [t.tol], se))
        numbers.append(f"{s} {_pct(d)}")
    return Claim("R4", text, combine(parts), "accuracy drop in points: " + ", ".join(numbers))


def claim_r5(t: TaskTable) -> Claim | None:
    schemes = ("path", "forget", "rope")
    text = (
        f"{t.task}: PaTH errs at most as often as FoX and RoPE on the sparse test at the training length "
        "(the PaTH paper's order)"
    )
    if not all(s in t.scores for s in schemes):
        return None
    if not all(t.learned(s) for s in schemes):
        return _undecided("R5", text, t, list(schemes))
    errs = {}
    for s in schemes:
        acc, se = t.values(s, "sparse", t.L0)
        errs[s] = ([1 - a for a in acc], se)
    se = max(v[1] for v in errs.values())
    verdict = combine([at_most(errs["path"][0], errs[o][0], se) for o in ("forget", "rope")])
    return Claim("R5", text, verdict, ", ".join(f"{s} {_pct(v[0])}%" for s, v in errs.items()))


def claim_r6(t: TaskTable) -> Claim | None:
    """State tracking (modsum): PaTH carries the running sum beyond the training length, no other learned scheme does.
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
    return Claim("R6", text, verdict, numbers)


def decay_window(rate: float) -> float:
    """The distance (tokens) at which a distance bias of ``rate`` nats per token reaches WINDOW_NATS, i.e. drops a
    key's softmax weight by e^WINDOW_NATS against a key at distance 0: w = WINDOW_NATS / rate (inf for rate <= 0)."""
    return WINDOW_NATS / rate if rate > 0 else math.inf


def follows_window(horizons: list[int | None], windows: list[float], censored: list[bool]) -> str:
    """Verdict of "the horizon follows the window" over seeds: a seed's horizon follows when it lies within
    [w / HORIZON_FACTOR, w x HORIZON_FACTOR] (None, the first bucket already short, counts 0); a horizon at the largest
    distance probed (``censored``) whose band reaches it is open (it may lie beyond). Holds when every seed follows,
    does not hold when none does and none is open, within noise otherwise."""
    state = []
    for h, w, cut in zip(horizons, windows, censored):
        lo, hi, v = w / HORIZON_FACTOR, w * HORIZON_FACTOR, _hval(h)
        state.append("open" if cut and hi >= v else lo <= v <= hi)
    if all(s is True for s in state):
        return HOLDS
    return FAILS if all(s is False for s in state) else NOISE


def _band(w: float) -> str:
    return f"[{w / HORIZON_FACTOR:.0f}, {w * HORIZON_FACTOR:.0f}]" if math.isfinite(w) else "unbounded"


def claim_alibi_slopes(t: TaskTable) -> Claim | None:
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
    windows = [decay_window(float(alibi_slopes(n).min())) for n in heads]
    hs = t.horizons(ALIBI)
    numbers = "; ".join(
        f"seed {seed}: {n} heads, flattest slope {float(alibi_slopes(n).min()):.4g}/token, w {w:.0f}, band {_band(w)}, "
        f"horizon {_h([h])} (bias there {_hval(h) * float(alibi_slopes(n).min()):.2g} nats)"
        for seed, n, w, h in zip(t.scores[ALIBI], heads, windows, hs)
    )
    return Claim("R7", text, follows_window(hs, windows, t.censored(ALIBI)), numbers)


def claim_forget_leak(t: TaskTable) -> Claim | None:
    """(R8) A forget gate's horizon follows its measured leak: the bias against a key d tokens back is the sum of the
    log forget gates over those d tokens (Lin et al. 2025, arXiv 2503.02130, eq. 4-6), about -r d for a gate that leaks
    r nats per token over the gap (``Task.leak``, measured by ``posenc.eval.tasks.gate_leak`` on each job), so the
    horizon of the flattest head (the smallest leak over every gated layer) should follow w = WINDOW_NATS / r within
    HORIZON_FACTOR (``follows_window``), each seed against its own leak; over every forget-gate scheme that learned.
    None when no forget-gate scheme was run; undecided when none learned, or the records keep no leak."""
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
    hs, ws, cut, numbers = [], [], [], []
    for s in measured:
        for (seed, h), c in zip(zip(t.scores[s], t.horizons(s)), t.censored(s)):
            r = min(min(row) for row in t.records[(s, seed)].leak)
            hs.append(h), ws.append(decay_window(r)), cut.append(c)
            numbers.append(
                f"{s} seed {seed}: leak {r:.4f} nats/token, w {ws[-1]:.0f}, band {_band(ws[-1])}, horizon {_h([h])} "
                f"(bias there {_hval(h) * r:.2g} nats)"
            )
    return Claim("R8", text, follows_window(hs, ws, cut), "; ".join(numbers))


def check_task_claims(t: TaskTable, meta: dict, text_records: list[Ppl]) -> list[Claim]:
    windows = meta.get("mixing_windows") or {}
    out = [claim_r1(t, flat_schemes(text_records)), claim_r2(t, windows), claim_r3(t, windows), claim_r4(t)]
    kind = t.task.partition(":")[0]
    if kind == "flipflop":
        out.append(claim_r5(t))
    if kind == "modsum":
        out.append(claim_r6(t))
    out += [claim_alibi_slopes(t), claim_forget_leak(t)]
    return [c for c in out if c is not None]


# ---------------------------------------------------------------- tables and plots


def _seeds_learned(t: TaskTable, s: str) -> str:
    """ "" when no seed or every seed learned, else "(k of n seeds learned)": a scheme that learns on some
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
        rows.append(
            [s, "" if w is None else f"{w:.0f}", _pct(t.id_acc(s))]
            + [_pct(t.values(s, "gap", bucket=b)[0]) for b in buckets]
            + [_h(t.horizons(s)) if t.learned(s) else "no verdict (did not learn)" + _seeds_learned(t, s)]
        )
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
        rows.append(
            [
                s,
                " / ".join(shown),
                f"{np.mean(reached):.0f}" if reached else "not reached",
                f"{len(reached)} of {len(runs)}",
            ]
        )
    what = "; ".join(sorted({c for c, _, _ in t.criterion.values()}))
    return (
        markdown_table(["scheme", "steps (each seed)", "mean over seeds that reached it", "reached"], rows)
        + f"\n\nCriterion: {what}."
    )


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


NOT_LEARNED_LS, WINDOW_LS = (
    ":",
    "-.",
)  # distance plot: the curve of a scheme that did not learn; a scheme's mixing window
WINDOW_LABEL = "mixing window w_0.01 (dash-dot, in the scheme's colour)"


def distance_figure(t: TaskTable, schemes: list[str], windows: dict, chance: float):
    """The figure of ``distance-TASK.png``: each scheme's controlled-gap accuracy (mean over seeds) against evidence
    distance (log axis); a scheme that did not learn is dotted, its mixing window w_0.01 (where known) a dash-dot
    vertical line in its colour (one legend entry for them all), the training length dashed black, chance grey.
    Identical curves stay visible (``posenc.reports.render.plot_lines``)."""
    from matplotlib.lines import Line2D

    fig, ax = figure(figsize=(9.5, 4.5))
    colors = {s: f"C{i % 10}" for i, s in enumerate(schemes)}
    lines = []
    for s in schemes:
        curves = [t.curve(s, seed) for seed in t.scores[s]]
        buckets = sorted(curves[0])
        lines.append(
            {
                "label": s + ("" if t.learned(s) else " (did not learn: dotted)"),
                "x": buckets,
                "y": [100 * np.mean([c[b] for c in curves if b in c]) for b in buckets],
                "ms": 4,
                "color": colors[s],
                "ls": "-" if t.learned(s) else NOT_LEARNED_LS,
            }
        )
    plot_lines(ax, lines)
    for s in schemes:
        if windows.get(s):
            ax.axvline(windows[s], color=colors[s], ls=WINDOW_LS, lw=1)
    ax.axvline(t.L0, color="black", ls="--", lw=1, label=f"training length {t.L0}")
    ax.axhline(100 * chance, color="grey", lw=1, label="chance")
    handles, labels = ax.get_legend_handles_labels()
    if any(windows.get(s) for s in schemes):  # one entry for every window line: grey, as each has its scheme's colour
        handles.append(Line2D([], [], color="grey", ls=WINDOW_LS, lw=1))
        labels.append(WINDOW_LABEL)
    log_scale(ax, "x", base=2)
    ax.set_xlabel("evidence distance (tokens)")
    ax.set_ylabel("accuracy (%)")
    ax.set_title(f"{t.task}: controlled-gap test")
    ax.legend(handles, labels, fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.grid(True, which="both", alpha=0.3)
    fig.tight_layout()
    return fig


def plot_distance(path: Path, t: TaskTable, schemes: list[str], windows: dict, chance: float) -> None:
    """``path``: :func:`distance_figure` as PNG."""
    save_figure(distance_figure(t, schemes, windows, chance), path)


def length_figure(t: TaskTable, schemes: list[str], chance: float):
    """The figure of ``length-TASK.png``: accuracy (mean over seeds) against sequence length, one panel per test (id,
    sparse, near, those run); the training length dashed, chance grey; identical curves stay visible."""
    tests = [test for test in ("id", "sparse", "near") if next(iter(t.scores[schemes[0]].values())).lengths(test)]
    fig, axes = figure(1, len(tests), figsize=(4.5 * len(tests), 4 + 0.18 * ((len(schemes) + 1) // 2)), squeeze=False)
    for ax, test in zip(axes[0], tests):
        lines = []
        for i, s in enumerate(schemes):
            lengths = next(iter(t.scores[s].values())).lengths(test)
            lines.append(
                {
                    "label": s,
                    "x": lengths,
                    "y": [100 * np.mean(t.values(s, test, L)[0]) for L in lengths],
                    "ms": 4,
                    "color": f"C{i % 10}",
                }
            )
        plot_lines(ax, lines)
        ax.axvline(t.L0, color="black", ls="--", lw=1)
        ax.axhline(100 * chance, color="grey", lw=1)
        log_scale(ax, "x", base=2)
        ax.set_xlabel("sequence length (tokens)")
        ax.set_ylabel("accuracy (%)")
        ax.set_title(f"{t.task}: {test}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(
            fontsize=7, ncol=2, loc="upper center", bbox_to_anchor=(0.5, -0.2)
        )  # below: per panel, its own repeats
    fig.tight_layout()
    return fig


def plot_length(path: Path, t: TaskTable, schemes: list[str], chance: float) -> None:
    """``path``: :func:`length_figure` as PNG."""
    save_figure(length_figure(t, schemes, chance), path)


def write_csv(path: Path, records: list[Task]) -> None:
    """retrieval.csv: one row per cell of each job, with the job's training length and steps
    (``posenc.store.records.load_task_csv`` reads it back)."""
    header = [
        "task",
        "scheme",
        "seed",
        "test",
        "length",
        "bucket",
        "answers",
        "correct",
        "accuracy",
        "nll_mean",
        "train_length",
        "trained_steps",
        "criterion_step",
    ]
    write_csv_table(
        path,
        header,
        (
            [
                r.task,
                r.scheme,
                r.seed,
                c.test,
                c.length,
                c.bucket,
                c.n,
                c.correct,
                f"{c.correct / c.n:.4f}",
                f"{c.nll / c.n:.4f}",
                r.train_length,
                r.trained_steps,
                r.criterion_step,
            ]
            for r in records
            for c in r.cells
        ),
    )


def _times_line(seconds: list[tuple[float, float]]) -> str:
    """Training and evaluation time ranges over the jobs that recorded them (records rebuilt from a CSV keep none:
    NaN)."""
    timed = [v for v in seconds if not any(math.isnan(x) for x in v)]
    if not timed:
        return "Training and evaluation times were not recorded."
    of = f" ({len(timed)} of {len(seconds)} jobs recorded their times)" if len(timed) < len(seconds) else ""
    return (
        f"Training time per job: {min(v[0] for v in timed):.0f}-{max(v[0] for v in timed):.0f} s; "
        f"evaluation {min(v[1] for v in timed):.0f}-{max(v[1] for v in timed):.0f} s{of}."
    )


def write_task_report(run_dir: Path, meta: dict, failures: dict[str, str] | None = None) -> Path:
    """report.md, retrieval.csv and two plots per task (distance-*.png, length-*.png); returns report.md's path."""
    run_dir = Path(run_dir)
    records = [r for r in load(run_dir / "results.jsonl") if isinstance(r, Task)]
    write_csv(run_dir / "retrieval.csv", records)
    ev, L0, windows = meta["eval"], meta["train_length"], meta.get("mixing_windows") or {}
    text = meta.get("text_results")
    text_records = read_text_results(Path(text)) if text else []
    st = meta["stamp"]
    lines = [
        f"# posenc retrieval: {meta['name']}",
        "",
        f"- model: {meta['model']}",
        f"- budget: {meta['budget']}",
        f"- seeds: {meta['seeds']}",
        f"- evaluation: answers per cell {ev['answers']} (or {ev['max_tokens']} tokens), "
        f"lengths {ev['multiples']} x {L0}; "
        f"learned: id accuracy >= {100 * ev['learned']:.0f}%; "
        f"horizon: accuracy within {100 * ev['horizon_tol']:.0f} points of id",
        f"- run: {stamp_line(st)} (each invocation: `invocations.jsonl`; each job's threads: its record)",
        f"- noise: a comparison is over seeds ({len(meta['seeds'])}) "
        "plus two binomial standard errors of the test sets; "
        + (
            "one seed does not measure training noise (thread count changes learned schemes' weights)"
            if len(meta["seeds"]) == 1
            else "the seed range is the training noise"
        ),
        "",
    ]
    if meta.get("notes"):
        lines += [meta["notes"], ""]
    lines += (
        meta.get("sweep") or []
    )  # posenc.runs.sweep.sweep_markdown: each scheme's chosen setting and the sensitivity table
    claims = []
    # every task the run holds: a task added by an earlier invocation (--tasks X, then --tasks Y) keeps its section
    tasks = {**meta["tasks"], **{r.task: get_task(r.task).describe() for r in records if r.task not in meta["tasks"]}}
    for task, desc in tasks.items():
        t = TaskTable(records, task, L0, ev["horizon_tol"], ev["learned"], meta.get("n_head"))
        schemes = [s for s in t.scores]
        lines += [f"## {task}", "", f"{desc}", ""]
        if not schemes:
            lines += ["No results yet.", ""]
            continue
        lines += ["### Accuracy (%) by test and sequence length", "", accuracy_markdown(t, schemes), ""]
        lines += [
            "### Accuracy (%) by evidence distance (controlled-gap test) and retrieval horizon",
            "",
            distance_markdown(t, schemes, windows),
            "",
        ]
        if t.criterion:
            lines += [
                "### Steps to criterion",
                "",
                criterion_markdown(t, [s for s in schemes if any(k[0] == s for k in t.criterion)]),
                "",
            ]
        lines += [_times_line(list(t.seconds.values())), ""]
        ref = meta.get("reference")
        if ref and ref.get("task", "flipflop") == task.partition(":")[0]:
            lines += [
                f"### Error (%) at the training length beside {ref['source']}",
                "",
                reference_markdown(t, ref),
                "",
            ]
            if ref.get("note"):
                lines += [ref["note"], ""]
        chance = get_task(task).chance
        plot_distance(run_dir / f"distance-{slug(task)}.png", t, schemes, windows, chance)
        plot_length(run_dir / f"length-{slug(task)}.png", t, schemes, chance)
        claims += check_task_claims(t, meta, text_records)
    if claims:
        lines += [
            "## Claims",
            "",
            markdown_table(
                ["claim", "verdict", "numbers"],
                [[f"({c.key}) {c.text}", f"**{c.verdict}**", c.evidence] for c in claims],
            ),
            "",
        ]
    elif records:
        lines += ["## Claims", "", "No claim applies: each compares schemes this run did not train.", ""]
    if text and not text_records:
        lines += [f"(R1 needs the text comparison {text} (results.jsonl or results.csv): not found.)", ""]
    if failures:
        lines += ["## Failed jobs", ""] + [f"- {k}: {v}" for k, v in failures.items()] + [""]
    path = run_dir / "report.md"
    atomic_write_bytes(path, "\n".join(lines).encode())
    return path
