"""The task claims R1-R8 of experiments/accumulated (arXiv 2606.24975 and the retrieval predictions) on hand-built task
tables: each verdict, undecided with its budget, roles found by canonical spec."""

import math
from pathlib import Path

from experiments.accumulated.claims import (
    check_task_claims,
    claim_alibi_slopes,
    claim_forget_leak,
    claim_r1,
    claim_r2,
    claim_r3,
    claim_r4,
    claim_r5,
    claim_r6,
    flat_schemes,
    follows_window,
    in_roles,
    log_horizon,
)
from posenc.reports.claims import FAILS, HOLDS, NOISE, STATED, UNDECIDED
from posenc.reports.tasks import TaskTable, horizon_cell, read_text_results
from tests import task_records as one_seed
from tests.task_records import gap_cells


def three_seeds(table):
    """A scheme given on seed 0 alone gets the same cells on seeds 0, 1 and 2: an interval needs two seeds."""
    return {s: ({i: seeds[0] for i in range(3)} if list(seeds) == [0] else seeds) for s, seeds in table.items()}


def task_records(task, table):
    return one_seed.task_records(task, three_seeds(table))


def task_table(task, table):
    return one_seed.task_table(task, three_seeds(table))


ROOT = Path(__file__).resolve().parents[2]


def test_claim_r1_verdicts():
    flat = {"alibi": [0.99], "forget": [0.99]}
    far = gap_cells(0.99, {64: 0.99, 128: 0.99, 256: 0.98})
    near = gap_cells(0.99, {64: 0.99, 128: 0.6, 256: 0.6})  # horizon 64: a bucket under 128
    assert claim_r1(task_table("flipflop", {"alibi": {0: near}, "forget": {0: far}}), flat).verdict == HOLDS
    assert claim_r1(task_table("flipflop", {"alibi": {0: far}, "forget": {0: far}}), flat).verdict == FAILS
    assert claim_r1(task_table("flipflop", {"alibi": {0: near, 1: far}, "forget": {0: far}}), flat).verdict == NOISE
    two_seeds = claim_r1(task_table("flipflop", {"alibi": {0: near}}), {"alibi": [0.986, 0.990]})
    assert (
        "alibi (ratio 0.988 ± 0.002 at the longest length)" in two_seeds.evidence
    )  # the table's mean, not the largest seed's 0.990
    not_learned = gap_cells(0.6, {64: 0.6})
    undecided = claim_r1(one_seed.task_table("flipflop", {"alibi": {0: not_learned}}), flat)
    assert undecided.verdict == UNDECIDED
    assert undecided.evidence == "alibi did not learn on seed 0 (id 60.0% < 90%: no loss curve in the records)"
    assert claim_r1(task_table("flipflop", {"rope": {0: near}}), flat) is None  # no flat scheme was run
    variant = [
        r.model_copy(update={"encoding": "forget:init_bias=4"}) if r.scheme == "forget" else r
        for r in task_records("flipflop", {"alibi": {0: near}, "forget": {0: far}})
    ]
    said = claim_r1(TaskTable(variant, "flipflop", 128, 0.05, 0.9), flat)
    assert said.verdict == HOLDS and said.evidence.endswith(
        "forget (ratio 0.990 at the longest length): horizon 256 (trained as forget:init_bias=4)"
    )  # the text run's forget is the plain scheme: the join says where the task run's differs


def test_claim_r2_verdicts():
    windows = {"acc-rand-qkv": 27, "acc-rand-qkv:a=0.5": 110, "acc-rand-qkv:a=2": 6}
    follows = {
        "acc-rand-qkv:a=2": {0: gap_cells(0.95, {8: 0.95, 16: 0.5})},
        "acc-rand-qkv": {0: gap_cells(0.95, {8: 0.95, 16: 0.95, 32: 0.95, 64: 0.5})},
        "acc-rand-qkv:a=0.5": {0: gap_cells(0.95, {8: 0.95, 256: 0.95, 512: 0.5})},
    }
    assert claim_r2(task_table("flipflop", follows), windows).verdict == HOLDS
    flat_horizon = {s: {0: gap_cells(0.95, {8: 0.95, 2048: 0.95})} for s in windows}
    assert claim_r2(task_table("flipflop", flat_horizon), windows).verdict == FAILS


def test_claim_r3_and_r5_and_r4():
    windows = {"acc-rand-qk": 27, "acc-rand-qkv": 27}
    t = task_table(
        "flipflop",
        {
            "acc-rand-qk": {0: gap_cells(0.95, {8: 0.95, 32: 0.8, 64: 0.7})},
            "acc-rand-qkv": {0: gap_cells(0.95, {8: 0.95, 32: 0.6, 64: 0.5})},
        },
    )
    assert claim_r3(t, windows).verdict == HOLDS
    t = task_table(
        "flipflop",
        {
            "acc-rand-qk": {0: gap_cells(0.95, {32: 0.5, 64: 0.5})},
            "acc-rand-qkv": {0: gap_cells(0.95, {32: 0.9, 64: 0.9})},
        },
    )
    assert claim_r3(t, windows).verdict == FAILS

    def sparse(err):
        return {("id", 128, 8): 0.99, ("sparse", 128, 8): 1 - err}

    assert (
        claim_r5(
            task_table("flipflop", {"path": {0: sparse(0.0)}, "forget": {0: sparse(0.1)}, "rope": {0: sparse(0.3)}})
        ).verdict
        == HOLDS
    )
    assert (
        claim_r5(
            task_table("flipflop", {"path": {0: sparse(0.3)}, "forget": {0: sparse(0.0)}, "rope": {0: sparse(0.3)}})
        ).verdict
        == FAILS
    )

    erode = {
        "rope": {0: gap_cells(0.95, {8: 0.95}, {128: 0.95, 4096: 0.4})},
        "alibi": {0: gap_cells(0.95, {8: 0.95}, {128: 0.95, 4096: 0.94})},
    }
    assert claim_r4(task_table("mqar", erode)).verdict == HOLDS
    keeps = {
        "rope": {0: gap_cells(0.95, {8: 0.95}, {128: 0.95, 4096: 0.95})},
        "alibi": {0: gap_cells(0.95, {8: 0.95}, {128: 0.95, 4096: 0.94})},
    }
    assert claim_r4(task_table("mqar", keeps)).verdict == FAILS


def test_claim_r4_on_flipflop_reads_near_buckets_of_the_id_test():
    def cells(far_acc):
        out = {("id", 128, 2): 0.99, ("id", 128, 8): 0.99, ("id", 128, 64): 0.99}
        out.update(
            {("id", 4096, 2): far_acc, ("id", 4096, 8): far_acc, ("id", 4096, 64): 0.2}
        )  # the far bucket is not near recall
        return out

    t = task_table("flipflop", {"rope": {0: cells(0.6)}, "forget": {0: cells(0.98)}})
    c = claim_r4(t)
    assert c.verdict == HOLDS and "rope 39.0" in c.evidence and "forget 1.0" in c.evidence
    t = task_table("flipflop", {"rope": {0: cells(0.99)}, "forget": {0: cells(0.98)}})
    assert claim_r4(t).verdict == FAILS


def test_claim_r4_without_near_reads_at_the_far_length_is_undecided():
    """A flip-flop id test whose far length holds no read < NEAR tokens back (evidence drawn over 1..L) divided by
    zero; a seed without them is left out, a scheme with none on any seed leaves the claim undecided."""

    def cells(near_far):
        out = {("id", 128, 2): 0.99, ("id", 128, 8): 0.99, ("id", 4096, 64): 0.5}
        return out | ({("id", 4096, 8): 0.6} if near_far else {})

    t = task_table("flipflop", {"rope": {0: cells(False)}, "forget": {0: cells(True)}})
    c = claim_r4(t)
    assert c.verdict == UNDECIDED and c.evidence == (
        "no seed has reads < 16 tokens back at both 128 and 4096 tokens: rope"
    )
    t = task_table("flipflop", {"rope": {0: cells(True), 1: cells(False)}, "forget": {0: cells(True)}})
    assert "rope 39.0" in claim_r4(t).evidence  # seed 1 has no near read at 4096: seed 0 alone


def test_flat_schemes_of_the_committed_default_run():
    records = read_text_results(ROOT / "results" / "default")
    flat = flat_schemes(records)
    assert sorted(flat) == ["alibi", "forget", "hybrid", "rope+forget"]  # ratio <= 1.02 at 128x on every seed
    assert len(flat["alibi"]) == 5 and max(flat["hybrid"]) < 1.0


def test_claim_r6_state_tracking():
    far, near = gap_cells(0.99, {8: 0.99, 1024: 0.99}), gap_cells(0.99, {8: 0.99, 64: 0.99, 256: 0.5})
    unlearned = gap_cells(0.6, {8: 0.6})
    claim = claim_r6(task_table("modsum", {"path": {0: far, 1: far}, "rope": {0: near}, "nope": {0: unlearned}}))
    assert (
        claim.verdict == HOLDS
        and claim.numbers == f"horizon: path {horizon_cell([1024])}, rope 64; did not learn: nope"
    )
    assert claim_r6(task_table("modsum", {"path": {0: near}, "rope": {0: near}})).verdict == FAILS  # PaTH stops inside
    assert (
        claim_r6(task_table("modsum", {"path": {0: far}, "acc-learned-qkv": {0: far}})).verdict == FAILS
    )  # another goes as far
    assert (
        claim_r6(task_table("modsum", {"path": {0: far, 1: near}, "rope": {0: near}})).verdict == NOISE
    )  # the seeds disagree
    assert (
        claim_r6(task_table("modsum", {"path": {0: unlearned}, "rope": {0: near}})).verdict == UNDECIDED
    )  # PaTH did not learn
    assert claim_r6(task_table("modsum", {"rope": {0: near}})) is None  # PaTH was not run


def test_task_claims_find_their_schemes_by_canonical_spec():
    """The library's table names each scheme as its run did, with this claim set registered (a claim set never
    renames the library's rows; the table renamed forget:scaled=false to the role forget before issue 61); the
    study's view (in_roles) finds its roles by spec, and check_task_claims reads that view."""
    flat = {"alibi": [0.99], "forget": [0.99]}
    far = gap_cells(0.99, {64: 0.99, 128: 0.99, 256: 0.98})
    near = gap_cells(0.99, {64: 0.99, 128: 0.6, 256: 0.6})  # horizon 64: a bucket under 128
    spelled = task_table("flipflop", {"alibi": {0: near}, "forget:scaled=false": {0: far}})
    assert sorted(spelled.scores) == ["alibi", "forget:scaled=false"]
    study = in_roles(spelled)
    assert sorted(study.scores) == ["alibi", "forget"] and study.records[("forget", 1)].scheme == "forget"
    assert claim_r1(study, flat).verdict == HOLDS
    verdicts = [(c.key, c.verdict) for c in check_task_claims(spelled, {}, [])]
    assert verdicts and verdicts == [(c.key, c.verdict) for c in check_task_claims(study, {}, [])]


def test_an_undecided_claim_names_each_seed_that_did_not_learn_and_its_budget():
    seeds = {0: gap_cells(0.99, {8: 0.99}), 1: gap_cells(0.6, {8: 0.6}), 2: gap_cells(0.5, {8: 0.5})}
    recs = task_records("modsum", {"path": seeds})
    steps = range(20, 620, 20)
    recs[1] = recs[1].model_copy(update={"loss_curve": [(s, 1.0 - s / 1000) for s in steps], "trained_steps": 600})
    recs[2] = recs[2].model_copy(update={"loss_curve": [(s, 0.69) for s in steps], "trained_steps": 600})
    c = claim_r6(TaskTable(recs, "modsum", 128, 0.05, 0.9))
    assert c.verdict == UNDECIDED
    assert c.evidence == (
        "path did not learn on seed 1 (id 60.0% < 90%: loss still falling at the step cap 600 "
        "(0.580 -> 0.420 over its last 160 steps): more steps); seed 2 (id 50.0% < 90%: loss flat at chance at the "
        "step cap 600 (0.690; ln 2 = 0.693): a plateau, not extended (the rule extends a falling loss): more steps "
        "untested, or another learning rate or head count)"
    )


def test_claims_r2_to_r5_are_undecided_when_their_schemes_did_not_learn():
    no = gap_cells(0.5, {8: 0.5, 64: 0.5})
    yes = gap_cells(0.95, {8: 0.95, 64: 0.9})
    windows = {"acc-rand-qkv": 27, "acc-rand-qkv:a=0.5": 110, "acc-rand-qk": 27}
    t = task_table(
        "flipflop",
        {
            "acc-rand-qkv": {0: no},
            "acc-rand-qkv:a=0.5": {0: yes},
            "acc-rand-qk": {0: yes},
            "rope": {0: no},
            "alibi": {0: yes},
            "path": {0: yes},
            "forget": {0: yes},
        },
    )
    assert [c.verdict for c in (claim_r2(t, windows), claim_r3(t, windows), claim_r5(t))] == [UNDECIDED] * 3
    assert (
        claim_r3(t, windows).evidence.startswith("acc-rand-qkv did not learn")
        and "acc-rand-qk " not in claim_r3(t, windows).evidence
    )
    assert claim_r5(t).evidence.startswith("rope did not learn")
    r4 = claim_r4(task_table("flipflop", {"rope": {0: no}, "acc-rand-qk": {0: no}, "alibi": {0: yes}}))
    assert (
        r4.verdict == UNDECIDED
        and r4.evidence.startswith("rope did not learn")
        and "acc-rand-qk did not learn" in r4.evidence
    )
    one_variant = task_table("flipflop", {"acc-rand-qkv": {0: yes}})
    assert claim_r2(one_variant, windows) is None  # nothing to order
    assert claim_r5(task_table("flipflop", {"path": {0: yes}, "forget": {0: yes}})) is None  # rope not run


def test_follows_window():
    """Two comparisons of log2(1 + horizon), paired with each seed's window: above w/4 and below 4 w, by half a
    bucket; a censored horizon (the largest distance probed) is a lower bound."""

    def verdicts(h, w, cut):
        return [o.verdict for o in follows_window([log_horizon(h)] * 3, [w] * 3, [cut] * 3, "h", STATED)]

    assert verdicts(128, 256, False) == [HOLDS, HOLDS]  # a bucket inside [64, 1024] on both sides
    assert verdicts(64, 256, False) == [NOISE, HOLDS]  # at w/4: not beyond it by the margin
    assert verdicts(16, 256, False) == [FAILS, HOLDS]
    assert verdicts(4096, 256, False) == [HOLDS, FAILS]
    assert verdicts(4096, 2048, True) == [HOLDS, NOISE]  # censored: it may lie beyond 4 w = 8192
    assert verdicts(4096, 512, True) == [HOLDS, FAILS]  # already beyond 4 w = 2048 as a lower bound
    assert len(follows_window([log_horizon(64)], [math.inf], [False], "h", STATED)) == 1  # no upper end


def _heads(recs, n):
    return [r.model_copy(update={"n_head": n}) for r in recs]


def test_claim_r7_alibi_horizon_follows_its_flattest_slope():
    near64 = gap_cells(0.99, {8: 0.99, 64: 0.99, 128: 0.99, 256: 0.5, 4096: 0.5})  # horizon 128
    near16 = gap_cells(0.99, {8: 0.99, 16: 0.99, 32: 0.5, 4096: 0.5})
    c = claim_alibi_slopes(
        TaskTable(_heads(task_records("flipflop", {"alibi": {0: near64}}), 4), "flipflop", 128, 0.05, 0.9)
    )
    assert c.key == "R7" and c.verdict == HOLDS  # slopes 1/4 .. 1/256: w = 256, band [64, 1024]
    assert c.numbers.startswith(
        "seed 0: 4 heads, flattest slope 0.003906/token, w 256, band [64, 1024], horizon 128 (bias there 0.5 nats); "
    )
    assert (
        claim_alibi_slopes(
            TaskTable(_heads(task_records("flipflop", {"alibi": {0: near16}}), 4), "flipflop", 128, 0.05, 0.9)
        ).verdict
        == FAILS
    )
    both = task_records("flipflop", {"alibi": {0: near64, 1: near16}})
    assert (
        claim_alibi_slopes(TaskTable(both, "flipflop", 128, 0.05, 0.9, n_head=2)).verdict == NOISE
    )  # the run's head count
    unknown = claim_alibi_slopes(TaskTable(both, "flipflop", 128, 0.05, 0.9))
    assert unknown.verdict == UNDECIDED and unknown.evidence.startswith("the head count is unknown")
    assert (
        claim_alibi_slopes(task_table("flipflop", {"alibi": {0: gap_cells(0.77, {8: 0.7})}})).verdict == UNDECIDED
    )  # did not learn
    assert claim_alibi_slopes(task_table("flipflop", {"rope": {0: near64}})) is None


def _leaks(recs, leak):
    return [r.model_copy(update={"leak": leak}) for r in recs]


def test_claim_r8_forget_horizon_follows_its_measured_leak():
    far = gap_cells(1.0, {8: 1.0, 64: 1.0, 1024: 1.0, 2048: 0.2, 4096: 0.5})
    near = gap_cells(1.0, {8: 1.0, 64: 1.0, 128: 0.5, 4096: 0.5})
    leak = [[0.40, 0.33], [0.0271, 0.0190]]  # the flattest head leaks 0.019 nats/token: w = 53, band [13, 211]
    c = claim_forget_leak(
        TaskTable(_leaks(task_records("flipflop", {"forget": {0: near}}), leak), "flipflop", 128, 0.05, 0.9)
    )
    assert c.key == "R8" and c.verdict == HOLDS
    assert c.numbers.startswith(
        "forget seed 0: leak 0.0190 nats/token, w 53, band [13, 211], horizon 64 (bias there 1.2 nats); "
    )
    assert (
        claim_forget_leak(
            TaskTable(_leaks(task_records("flipflop", {"forget": {0: far}}), leak), "flipflop", 128, 0.05, 0.9)
        ).verdict
        == FAILS
    )
    mixed = _leaks(task_records("flipflop", {"forget": {0: near}, "rope+forget": {0: far}}), leak)
    # each scheme its own comparisons: rope+forget's horizon 1024 lies beyond 4 w = 211 on every seed
    assert claim_forget_leak(TaskTable(mixed, "flipflop", 128, 0.05, 0.9)).verdict == FAILS
    unmeasured = claim_forget_leak(task_table("flipflop", {"forget": {0: far}}))
    assert unmeasured.verdict == UNDECIDED and unmeasured.evidence.startswith("no leak in the records of forget")
    assert claim_forget_leak(task_table("flipflop", {"forget": {0: gap_cells(0.6, {8: 0.6})}})).verdict == UNDECIDED
    assert claim_forget_leak(task_table("flipflop", {"rope": {0: far}})) is None


def test_asking_about_a_scheme_without_records_adds_none():
    path, rope = gap_cells(0.99, {8: 0.99, 1024: 0.99}), gap_cells(0.6, {8: 0.6})
    t = task_table("modsum", {"path": {0: path}, "rope": {0: rope}})
    assert not t.learned("acc-rand-qk") and t.seeds_learned("acc-rand-qk") == (0, 0)
    assert (
        list(t.scores) == ["path", "rope"]
        and claim_r6(t).numbers == f"horizon: path {horizon_cell([1024])}; did not learn: rope"
    )
