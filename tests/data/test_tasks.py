"""Synthetic tasks: answer marks and evidence distances on hand-built and brute-force-checked sequences,
seeded batches, bad specs, answer-only loss, scoring, horizons and the retrieval claims."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from posenc.config.plan import load_preset
from posenc.data.tasks import B0, B1, I, R, W, get_task, is_task
from posenc.errors import PosencError
from posenc.eval.tasks import bucket, precise, score_batch, score_test
from posenc.reports.tasks import (
    accuracy_markdown,
    budget,
    distance_markdown,
    horizon,
)
from posenc.store.checkpoint import read_jsonl
from posenc.store.records import Task
from posenc.train.batches import mean_loss
from tests.task_records import gap_cells, task_job, task_records, task_table

ROOT = Path(__file__).resolve().parents[2]


def _check_flipflop(tok, answer, distance):
    """Brute force: an answer exactly at each read's bit, equal to the last write's bit, at the distance between
    them."""
    last_write_bit = None
    for t in range(len(tok) - 1):
        if tok[t] == W and t % 2 == 0:
            last_write_bit = t + 1
        is_read = t % 2 == 0 and tok[t] == R
        assert answer[t] == is_read, t
        if is_read:
            assert tok[t + 1] == tok[last_write_bit]
            assert distance[t] == t + 1 - last_write_bit
        else:
            assert distance[t] == 0


@pytest.mark.parametrize("p_ignore", [0.0, 0.5, 0.8, 0.98])
def test_flipflop_marks_match_brute_force(p_ignore):
    task = get_task(f"flipflop:p_ignore={p_ignore},distances=geometric")
    for seed in range(5):
        tok, answer, distance = task.row(np.random.default_rng(seed), 301)
        assert tok[0] == W and len(tok) == 302 and set(tok[0::2]) <= {W, R, I} and set(tok[1::2]) <= {B0, B1}
        _check_flipflop(tok, answer, distance)


def test_flipflop_density():
    tok, answer, _ = get_task("flipflop:distances=geometric").row(np.random.default_rng(0), 200_001)
    instr = tok[0::2]
    assert abs(np.mean(instr == I) - 0.8) < 0.01 and abs(np.mean(instr == R) - 0.1) < 0.01
    assert answer.sum() == (instr[:-1] == R).sum() + (instr[-1] == R and len(tok) % 2 == 0)


def test_flipflop_probe_by_hand():
    task = get_task("flipflop")
    tok, answer, distance = task.row(np.random.default_rng(3), 8 + 6 + 1, gap=6)
    # 8 prefix tokens, then: write b, (ignore x) twice, read b
    tail = tok[8:]
    assert [tail[0], tail[2], tail[4], tail[6]] == [W, I, I, R]
    assert tail[1] == tail[7] and tail[1] in (B0, B1)
    assert answer.tolist() == [False] * 14 + [True] and distance[-1] == 6 and distance[:-1].sum() == 0
    _check_flipflop(tok, answer, distance)  # the prefix's reads are not answers, but the brute force sees them
    with pytest.raises(PosencError, match="even"):
        task.row(np.random.default_rng(0), 20, gap=5)


def test_flipflop_probe_is_marked_only_at_its_read():
    task = get_task("flipflop")
    tok, answer, distance = task.row(np.random.default_rng(1), 128 + 64 + 1, gap=64)
    assert answer.sum() == 1 and answer[-1] and distance[-1] == 64
    write_bit = len(tok) - 1 - 64
    assert tok[write_bit - 1] == W and tok[write_bit] == tok[-1]
    assert all(tok[i] == I for i in range(write_bit + 1, len(tok) - 2, 2))


def _check_modsum(m, tok, answer, distance):
    """Brute force: an answer exactly at each sum after a query, equal to the running sum mod m of the
    elements before it, at the distance back to the previous sum (or to position -1, the start)."""
    total, last = 0, -1
    for t in range(len(tok) - 1):
        is_sum = tok[t] == m
        assert answer[t] == is_sum, t
        if is_sum:
            assert tok[t + 1] == m + 1 + total % m and distance[t] == t + 1 - last
            last = t + 1
        else:
            assert distance[t] == 0
            total += tok[t] if tok[t] < m else 0


@pytest.mark.parametrize("m, p_query", [(2, 0.1), (3, 0.5), (5, 0.02)])
def test_modsum_marks_match_brute_force(m, p_query):
    task = get_task(f"modsum:m={m},p_query={p_query},distances=geometric")
    for seed in range(5):
        tok, answer, distance = task.row(np.random.default_rng(seed), 300)
        assert len(tok) == 301 and tok.min() >= 0 and tok.max() <= 2 * m and tok[-1] != m
        assert np.all(tok[np.flatnonzero(tok[:-1] == m) + 1] > m)  # every query is followed by its sum
        _check_modsum(m, tok, answer, distance)


def test_modsum_by_hand():
    task = get_task("modsum:m=3")
    tok = np.array([1, 2, 3, 1 + 3 + 0, 2, 3, 1 + 3 + 2, 2, 2, 3, 1 + 3 + 0])  # 1 2 ? 0 | 2 ? 2 | 2 2 ? 0
    _check_modsum(3, tok, tok[:-1] == 3, np.array([0, 0, 4, 0, 0, 3, 0, 0, 0, 4]))
    with pytest.raises(AssertionError):  # a wrong sum is caught
        _check_modsum(3, np.array([1, 3, 1 + 3 + 0]), np.array([False, True]), np.array([0, 3]))
    assert task.vocab_size == 7 and task.chance == pytest.approx(1 / 3)
    density = get_task("modsum:p_query=0.25,distances=geometric").row(np.random.default_rng(0), 100_000)[0]
    assert abs(np.mean(density == 2) - 0.2) < 0.01  # queries per token: p / (1 + p), each query takes two tokens


def test_modsum_probe_is_marked_only_at_its_sum():
    task = get_task("modsum:m=5")
    tok, answer, distance = task.row(np.random.default_rng(1), 128 + 64 + 1, gap=64)
    assert answer.sum() == 1 and answer[-1] and distance[-1] == 64
    revealed = len(tok) - 1 - 64
    assert tok[revealed - 1] == 5 and tok[-2] == 5 and np.all(tok[revealed + 1 : -2] < 5)
    _check_modsum(5, tok, tok[:-1] == 5, _distances(tok, 5))  # every sum of the probe, the prefix's too, is right
    with pytest.raises(PosencError, match="gap 1 must be >= 2"):
        task.row(np.random.default_rng(0), 20, gap=1)


def _distances(tok, m):
    """Distances back to the previous sum for every sum of ``tok`` (the brute force's own bookkeeping)."""
    out, last = np.zeros(len(tok) - 1, dtype=np.int64), -1
    for t in range(len(tok) - 1):
        if tok[t] == m:
            out[t], last = t + 1 - last, t + 1
    return out


def _check_mqar(task, tok, answer, distance):
    v = task.values
    K, V, P = v["keys"], v["values"], v["pairs"]
    q0 = len(tok) - 2 * (v["asks"] or P)
    pairs = {}
    for i, t in enumerate(tok[:q0]):
        if v["fused"] and t >= K + V + v["filler"]:
            pairs[(t - K - V - v["filler"]) // V] = (K + (t - K - V - v["filler"]) % V, i)
        elif not v["fused"] and t < K:
            pairs[t] = (tok[i + 1], i + 1)
    assert len(pairs) == P
    for t in range(len(tok) - 1):
        expect = t >= q0 and (t - q0) % 2 == 0
        assert answer[t] == expect
        if expect:
            value, where = pairs[tok[t]]
            assert tok[t + 1] == value and distance[t] == t + 1 - where
            pairs[tok[t]] = (value, t + 1)  # a key asked again: its latest answer is the nearest evidence


@pytest.mark.parametrize("fused", [False, True])
def test_mqar_marks_match_brute_force(fused):
    task = get_task(f"mqar:pairs=5,keys=9,values=7,filler=3,gap=4-40,fused={str(fused).lower()}")
    for seed in range(6):
        tok, answer, distance = task.row(np.random.default_rng(seed), 64)
        assert len(tok) == 65 and tok.max() < task.vocab_size
        _check_mqar(task, tok, answer, distance)


def test_mqar_random_queries_repeat_keys_and_mark_their_values():
    """queries=random: P keys drawn with replacement (repeats occur; each answer is its key's value, checked by
    brute force); the default asks every key once, with the draws of every committed run."""
    task = get_task("mqar:pairs=3,keys=9,values=7,filler=3,gap=4-40,queries=random")
    repeats = 0
    for seed in range(20):
        tok, answer, distance = task.row(np.random.default_rng(seed), 64)
        _check_mqar(task, tok, answer, distance)
        asked = tok[len(tok) - 6 :: 2]
        repeats += len(set(asked.tolist())) < 3
    assert repeats >= 10  # P(all three distinct) = 3!/27 = 2/9: repeats in about 78% of rows
    plain = get_task("mqar:pairs=3,keys=9,values=7,filler=3,gap=4-40")
    for seed in range(5):
        asked = plain.row(np.random.default_rng(seed), 64)[0][-6::2]
        assert len(set(asked.tolist())) == 3


def test_mqar_asks_sets_the_queries_per_sequence():
    """asks=Q with queries=random: Q answers per row after the gap, each its key's value (brute force); the span
    and the vocabulary follow; asks=P is the default's row, draw for draw."""
    task = get_task("mqar:pairs=3,keys=9,values=7,filler=3,gap=4-20,queries=random,asks=10")
    assert task.span() == 2 * 3 + 2 * 10
    for seed in range(10):
        tok, answer, distance = task.row(np.random.default_rng(seed), 64)
        assert answer.nonzero()[0].tolist() == list(range(65 - 20, 64, 2))  # the query keys of the last 20 tokens
        _check_mqar(task, tok, answer, distance)
    same = get_task("mqar:pairs=3,keys=9,values=7,filler=3,gap=4-20,queries=random,asks=3")
    base = get_task("mqar:pairs=3,keys=9,values=7,filler=3,gap=4-20,queries=random")
    for seed in range(3):
        a, b = same.row(np.random.default_rng(seed), 64), base.row(np.random.default_rng(seed), 64)
        assert all(np.array_equal(x, y) for x, y in zip(a, b))


def test_mqar_by_hand_gap_and_near():
    task = get_task("mqar:pairs=2,keys=4,values=4,filler=2,gap=0-4")
    tok, answer, distance = task.row(np.random.default_rng(0), 2 * 2 + 3 + 2 * 2 - 1, gap=3)
    assert all(t < 4 for t in tok[0:4:2]) and all(4 <= t < 8 for t in tok[1:4:2])  # pairs at the start (no filler)
    assert all(8 <= t < 10 for t in tok[4:7])  # the gap's filler
    assert answer.nonzero()[0].tolist() == [7, 9]
    _check_mqar(task, tok, answer, distance)
    tok, answer, distance = task.row(np.random.default_rng(0), 40, pre=33)  # near: 33 filler, pairs, queries at once
    assert all(8 <= t < 10 for t in tok[:33]) and tok[33] < 4
    _check_mqar(task, tok, answer, distance)
    assert sorted(distance[answer].tolist()) in ([4, 4], [2, 6])


def test_batches_are_functions_of_seed_step_row():
    task = get_task("mqar")
    full = task.batch(7, 3, range(8), 128)
    part = task.batch(7, 3, range(8)[2:5], 128)
    assert torch.equal(full.inputs[2:5], part.inputs) and torch.equal(full.distance[2:5], part.distance)
    assert torch.equal(task.batch(7, 3, range(8), 128).inputs, full.inputs)
    assert not torch.equal(task.batch(7, 4, range(8), 128).inputs, full.inputs)
    assert torch.equal(full.targets[:, :-1], full.inputs[:, 1:])


@pytest.mark.parametrize(
    "spec, message",
    [
        ("flipflop:p_ignore=1.5", "p_ignore must be in"),
        ("flipflop:bogus=1", "unknown parameter 'bogus'"),
        ("flipflop:p_ignore=x", "p_ignore must be float"),
        ("mqar:pairs=20,keys=4", "at least as many keys"),
        ("mqar:gap=9-3", "LO > HI"),
        ("mqar:queries=some", "queries must be 'all' or 'random'"),
        ("mqar:pairs=4,asks=8", "asks=8 needs queries=random"),
        ("mqar:queries=random,asks=-1", "asks must be >= 0"),
        ("mqar:gap=a", "gap must be N, LO-HI or LO-fit"),
        ("mqar:gaps=geometric", "gaps must be log-uniform or uniform"),
        ("flipflop:distances=uniform", "distances must be log-uniform or geometric"),
        ("mqar:", "empty parameter list"),
        ("mqar:pairs", "expected key=value"),
        ("modsum:m=1", "m must be >= 2"),
        ("modsum:p_query=0", "p_query must be in"),
        ("modsum:sparse=1.0", "sparse must be in"),
        ("fliflop", None),
    ],
)
def test_bad_task_specs(spec, message):
    if message is None:
        assert not is_task(spec)
        return
    with pytest.raises(PosencError, match=message):
        get_task(spec)


def test_gap_longer_than_training_length_is_refused():
    with pytest.raises(PosencError, match="exceeds the training length"):
        load_preset("retrieval", {"tasks": ["mqar:gap=0-200"]})


def test_task_corpus_in_a_text_command_is_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "posenc.cli.main", "eval", "--run", str(tmp_path), "--corpus", "flipflop"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "posenc.cli.main",
            "train",
            "--scheme",
            "rope",
            "--preset",
            "quick",
            "--corpus",
            "flipflop:p_ignore=1.5",
            "--out",
            str(tmp_path / "r"),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0 and "p_ignore must be in" in proc.stderr


def test_answer_loss_on_text_is_refused(tmp_path):
    from posenc.model import ModelConfig
    from posenc.train.loop import train
    from posenc.train.settings import TrainConfig

    with pytest.raises(PosencError, match="needs a synthetic task corpus"):
        train(
            tmp_path / "r",
            ModelConfig(n_layer=1, d_model=32, n_head=2, train_length=16),
            TrainConfig(loss="answers", corpus="pystdlib", steps=1),
        )


def test_mean_loss_averages_answers_only():
    nll = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    answers = torch.tensor([[False, True, False], [True, False, True]])
    assert mean_loss(nll, answers).item() == pytest.approx((2 + 4 + 6) / 3)
    assert mean_loss(nll, None).item() == pytest.approx(3.5)


def test_score_batch_counts_per_bucket():
    assert bucket(torch.tensor([1, 2, 3, 4, 7, 8, 1000])).tolist() == [1, 2, 2, 4, 4, 8, 512]
    logits = torch.zeros(1, 4, 3)
    logits[0, 0, 1] = logits[0, 1, 2] = logits[0, 2, 0] = logits[0, 3, 1] = 5.0
    targets = torch.tensor([[1, 0, 0, 1]])
    answer = torch.tensor([[True, True, False, True]])
    distance = torch.tensor([[2, 3, 0, 9]])
    out = score_batch(logits, targets, answer, distance)
    assert sorted(out) == [2, 8]
    assert out[2][:2] == [2.0, 1.0] and out[8][:2] == [1.0, 1.0]
    p = torch.log_softmax(torch.tensor([0.0, 5.0, 0.0]), -1)
    assert out[8][2] == pytest.approx(-p[1].item())


def test_precise_asks_each_bucket_for_its_answers_at_an_accuracy_moved_toward_one_half():
    # at 50%: 625 answers give sqrt(.25 / 625) = 0.02 exactly; one fewer is above it
    assert precise({8: [625, 312.5 - 2]}, 0.02) and not precise({8: [624, 310]}, 0.02)
    # all right: (n + 2) / (n + 4) keeps the error above zero; n = 68 is the first within 2 points
    assert precise({8: [68, 68]}, 0.02) and not precise({8: [67, 67]}, 0.02)
    assert not precise({8: [16, 16]}, 0.02)  # 16 of 16: a plain standard error of 0, not the stop
    assert not precise({8: [70, 70], 16: [624, 310]}, 0.02)  # every bucket of the cell
    assert not precise({}, 0.02)


def test_a_cell_with_a_standard_error_target_draws_until_its_bucket_is_that_precise():
    from posenc import build_model

    task = get_task("flipflop")
    torch.manual_seed(0)
    model = build_model({"vocab_size": task.vocab_size, "n_layer": 1, "n_head": 2, "d_model": 16, "train_length": 16})
    test = next(t for t in task.tests(16, [1, 2]) if t.name == "gap")
    one_row = test.length  # one probe, one answer, per batch
    cell = score_test(model, task, test, 10**6, 10**9, one_row, se=0.05)
    ((b, (n, c, _)),) = cell.items()
    assert precise(cell, 0.05) and n > 10  # the untrained model is always wrong: 26 answers
    shorter = score_test(model, task, test, int(n) - 1, 10**9, one_row)  # the same draws, one answer fewer
    assert not precise(shorter, 0.05) and shorter[b][0] == n - 1
    assert score_test(model, task, test, int(n), 10**9, one_row) == cell  # the stop changes the count, not a draw
    capped = score_test(model, task, test, 10**6, 3 * one_row, one_row, se=0.05)
    assert capped[b][0] == 3  # max_tokens still caps it


def test_horizon():
    assert horizon({8: 0.99, 16: 0.97, 32: 0.92, 64: 0.99}, 0.98, 0.05) == 16
    assert horizon({8: 0.99, 16: 0.99}, 0.98, 0.05) == 16
    assert horizon({8: 0.5, 16: 0.99}, 0.98, 0.05) is None


def test_a_scheme_learned_on_some_seeds_only_is_not_learned_and_says_how_many():
    t = task_table(
        "flipflop",
        {
            "rope": {0: gap_cells(0.98, {8: 0.98}), 1: gap_cells(0.7, {8: 0.7}), 2: gap_cells(0.8, {8: 0.8})},
            "nope": {0: gap_cells(0.6, {8: 0.6}), 1: gap_cells(0.6, {8: 0.6})},
            "path": {0: gap_cells(1.0, {8: 1.0}), 1: gap_cells(1.0, {8: 1.0})},
        },
    )
    rows = {
        line.split(" | ")[0].strip("| "): line for line in accuracy_markdown(t, ["rope", "nope", "path"]).splitlines()
    }
    assert "**did not learn** (1 of 3 seeds learned)" in rows["rope"]
    assert "**did not learn** |" in rows["nope"] and "seeds learned" not in rows["nope"]
    assert "| yes |" in rows["path"]
    assert "no verdict (did not learn) (1 of 3 seeds learned)" in distance_markdown(t, ["rope"], {})


def _tiny_preset(tmp_path, **over):
    body = {
        "name": "tiny",
        "model": {"n_layer": 1, "n_head": 2, "d_model": 32, "train_length": 32},
        "train": {"steps": 4, "batch_size": 4, "lr": 3e-3, "warmup": 1, "loss": "answers", "ckpt_every": 2},
        "tasks": ["flipflop", "mqar:pairs=2,keys=4,values=4,filler=2,gap=0-8"],
        "task_eval": {"multiples": [1, 2], "answers": 40, "max_tokens": 1024},
        "schemes": ["rope", "acc-rand-qkv"],
        **over,
    }
    import yaml

    path = tmp_path / "tiny.yaml"
    path.write_text(yaml.safe_dump(body))
    return path


def test_compare_tasks_end_to_end_resumes_and_refuses_other_settings(tmp_path):
    from posenc.jobs.compare import compare

    preset = load_preset(str(_tiny_preset(tmp_path)))
    report, failures = compare(preset, tmp_path / "runs", isolate=False)
    assert not failures
    records = read_jsonl(tmp_path / "runs" / "tiny" / "results.jsonl")
    assert sorted((r["task"], r["scheme"]) for r in records) == sorted(
        (t, s) for t in preset.tasks for s in preset.schemes
    )
    flip = next(r for r in records if r["task"] == "flipflop")
    tests = {c["test"] for c in flip["cells"]}
    assert tests == {"id", "sparse", "dense", "gap"}
    gaps = {c["bucket"] for c in flip["cells"] if c["test"] == "gap"}
    assert gaps == {8, 16, 32, 64}  # powers of two up to the longest test length (2 x 32)
    text = report.read_text()
    assert "## flipflop" in text and "horizon" in text and "did not learn" in text
    assert (tmp_path / "runs" / "tiny" / "distance-flipflop.png").exists()
    assert (tmp_path / "runs" / "tiny" / "retrieval.csv").read_text().count("\n") == 1 + sum(
        len(r["cells"]) for r in records
    )
    compare(preset, tmp_path / "runs", isolate=False)  # a rerun: nothing new
    assert len(read_jsonl(tmp_path / "runs" / "tiny" / "results.jsonl")) == len(records)
    other = load_preset(str(_tiny_preset(tmp_path, task_eval={"multiples": [1, 2], "answers": 41, "max_tokens": 1024})))
    with pytest.raises(PosencError, match="other settings"):
        compare(other, tmp_path / "runs", isolate=False)


def test_trained_from_scores_another_comparisons_models_anew_and_refuses_other_training(tmp_path, capsys):
    from posenc.cli.main import main
    from posenc.jobs.compare import compare

    preset = load_preset(str(_tiny_preset(tmp_path, schemes=["rope"], tasks=["flipflop"])))
    compare(preset, tmp_path / "runs", isolate=False)
    first = tmp_path / "runs" / "tiny" / "flipflop" / "rope" / "seed0"
    far = {"multiples": [1, 2], "answers": 10**6, "max_tokens": 10**6, "se": 0.02}
    again = load_preset(str(_tiny_preset(tmp_path, name="again", schemes=["rope"], tasks=["flipflop"], task_eval=far)))
    compare(again, tmp_path / "runs", isolate=False, trained_from=tmp_path / "runs" / "tiny")
    taken = tmp_path / "runs" / "again" / "flipflop" / "rope" / "seed0"
    assert "1 trained model(s) taken from" in capsys.readouterr().err
    for name in ("model.safetensors", "train.jsonl", "train_summary.json"):  # copied, not trained again
        assert (taken / name).read_bytes() == (first / name).read_bytes()
    assert not (taken / "state.pt").exists()
    (old,), (new,) = (read_jsonl(tmp_path / "runs" / n / "results.jsonl") for n in ("tiny", "again"))
    gaps = [{c["bucket"]: [c["n"], c["correct"]] for c in r["cells"] if c["test"] == "gap"} for r in (old, new)]
    assert gaps[0].keys() == gaps[1].keys() == {8, 16, 32, 64}
    assert not all(precise({b: v}, 0.02) for b, v in gaps[0].items())  # one batch of probes each
    assert all(precise({b: v}, 0.02) for b, v in gaps[1].items())  # scored anew, each to 2 points
    assert new["train_seconds"] == old["train_seconds"]
    report = (tmp_path / "runs" / "again" / "report.md").read_text()  # where the models came from, and the stop rule
    assert f"- models: 1 of 1 models taken from {(tmp_path / 'runs' / 'tiny').resolve()}, trained at commit" in report
    assert "or every bucket's standard error <= 2 points)" in report
    # a rerun naming another source than the one its models came from
    copy = tmp_path / "copy" / "tiny"
    shutil.copytree(tmp_path / "runs" / "tiny", copy)
    with pytest.raises(
        PosencError, match=r"took its model from .*runs/tiny: give that --trained-from, or leave it out"
    ):
        compare(again, tmp_path / "runs", isolate=False, trained_from=copy)
    # models trained here, a source naming models there: refused (the command line would name it)
    with pytest.raises(PosencError, match="holds a model trained here, not taken from .*copy/tiny: leave out"):
        compare(preset, tmp_path / "runs", isolate=False, trained_from=copy)
    # a model taken from a comparison that took it names the one that trained it; a damaged record is one line
    compare(again, tmp_path / "chain", isolate=False, trained_from=tmp_path / "runs" / "again")
    chained = (tmp_path / "chain" / "again" / "report.md").read_text()
    assert (
        f"taken from {(tmp_path / 'runs' / 'again').resolve()} (trained in {(tmp_path / 'runs' / 'tiny').resolve()})"
        in chained
    )
    (taken / "trained_from.json").write_text("{}")
    lines = (tmp_path / "runs" / "again" / "invocations.jsonl").read_text()
    with pytest.raises(PosencError, match=r"trained_from.json is damaged \(from, trained_in and commit"):
        compare(again, tmp_path / "runs", isolate=False)
    assert (tmp_path / "runs" / "again" / "invocations.jsonl").read_text() == lines  # refused before any write
    (taken / "trained_from.json").write_text(
        json.dumps({"from": str((tmp_path / "runs" / "tiny").resolve()), "trained_in": "x", "commit": "y"})
    )
    # trained otherwise (4 steps there, 5 here), a source with damaged weights, or none: refused, nothing written
    five = load_preset(
        str(_tiny_preset(tmp_path, name="five", tasks=["flipflop"], schemes=["rope"])), {"train.steps": 5}
    )
    with pytest.raises(
        PosencError, match=r"not trained with the settings of five's job .*steps.*; give --trained-from"
    ):
        compare(five, tmp_path / "runs", isolate=False, trained_from=tmp_path / "runs" / "tiny")
    weights = copy / "flipflop" / "rope" / "seed0" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:1000])
    with pytest.raises(PosencError, match="model.safetensors is damaged or unreadable"):
        compare(again, tmp_path / "other", isolate=False, trained_from=copy)
    with pytest.raises(PosencError, match="no trained model where this comparison.s jobs would take one"):
        compare(again, tmp_path / "other", isolate=False, trained_from=tmp_path / "runs")
    assert not (tmp_path / "runs" / "five").exists() and not (tmp_path / "other").exists()
    # an interrupted job of this run that saved no checkpoint takes the model; one that did is named
    (tmp_path / "late" / "again" / "flipflop" / "rope" / "seed0").mkdir(parents=True)
    compare(again, tmp_path / "late", isolate=False, trained_from=tmp_path / "runs" / "tiny")
    assert read_jsonl(tmp_path / "late" / "again" / "results.jsonl")[0]["cells"] == new["cells"]
    halfway = tmp_path / "half" / "again" / "flipflop" / "rope" / "seed0"
    halfway.mkdir(parents=True)
    (halfway / "state.pt").write_bytes(b"")
    with pytest.raises(PosencError, match="holds an unfinished training of its own: move it away to take"):
        compare(again, tmp_path / "half", isolate=False, trained_from=tmp_path / "runs" / "tiny")
    capsys.readouterr()
    code = main(["compare", "--preset", "quick", "--trained-from", str(tmp_path / "nowhere"), "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "--trained-from" in err and "not a directory" in err
    dry = ["compare", "--preset", str(tmp_path / "tiny.yaml"), "--name", "five", "--set", "train.steps=5", "--dry-run"]
    code = main([*dry, "--out", str(tmp_path / "runs"), "--trained-from", str(tmp_path / "runs" / "tiny")])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "not trained with the settings of five's job" in err


def test_repeated_seeds_schemes_or_tasks_are_refused():
    for key, value in (("seeds", [0, 0]), ("schemes", ["rope", "rope"]), ("tasks", ["flipflop", "flipflop"])):
        with pytest.raises(PosencError, match="repeated"):
            load_preset("retrieval", {key: value})
    proc = subprocess.run(
        [sys.executable, "-m", "posenc.cli.main", "compare", "--preset", "quick", "--seeds", "0", "0"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2 and "0 repeated" in proc.stderr and proc.stderr.count("\n") == 1


def test_a_small_corpus_trains_with_a_warning(tmp_path, capsys):
    from posenc.model import ModelConfig
    from posenc.train.loop import train
    from posenc.train.settings import TrainConfig

    corpus = tmp_path / "tiny.txt"
    corpus.write_text("to be or not to be, that is the question. " * 70)  # ~3K bytes
    train(
        tmp_path / "r",
        ModelConfig(n_layer=1, d_model=32, n_head=2, train_length=16),
        TrainConfig(corpus=str(corpus), steps=2, batch_size=2, warmup=1),
    )
    err = capsys.readouterr().err
    assert "only 2,648 tokens" in err and "memorisation" in err


@pytest.mark.slow
def test_task_comparison_through_submitit_local_jobs_tracks_to_tensorboard(tmp_path):
    """--launcher local and --log tensorboard on a task preset: real submitit jobs, event files read back."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from posenc.jobs.compare import compare

    preset = load_preset(str(_tiny_preset(tmp_path, schemes=["rope"], tasks=["flipflop"])))
    report, failures = compare(preset, tmp_path / "runs", launcher="local", log="tensorboard")
    assert not failures and report.exists()
    (record,) = read_jsonl(tmp_path / "runs" / "tiny" / "results.jsonl")
    cells = [c for c in record["cells"] if c["test"] == "id" and c["length"] == 32]
    acc = EventAccumulator(str(tmp_path / "runs" / "tiny" / "flipflop" / "rope" / "seed0"))
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/loss")] == [4]
    (logged,) = acc.Scalars("eval/id@1x")
    assert logged.step == 4
    assert logged.value == pytest.approx(sum(c["correct"] for c in cells) / sum(c["n"] for c in cells), abs=1e-6)
    assert {"eval/id@2x", "eval/sparse@1x", "eval/gap@8", "eval/gap@64"} <= set(acc.Tags()["scalars"])
    assert not any(tag.startswith("eval/gap@") and tag.endswith("x") for tag in acc.Tags()["scalars"])


def test_task_comparisons_refuse_several_processes_per_job(tmp_path):
    from posenc.jobs.compare import compare

    with pytest.raises(PosencError, match="no --nproc-per-node"):
        compare(load_preset(str(_tiny_preset(tmp_path))), tmp_path / "runs", nproc_per_node=2)


def test_the_time_line_counts_only_jobs_that_recorded_their_times():
    from posenc.reports.tasks import _times_line

    assert _times_line([(130.0, 30.0), (float("nan"), float("nan")), (200.0, 40.0)]) == (
        "Training time per job: 130-200 s; evaluation 30-40 s (2 of 3 jobs recorded their times)."
    )
    assert _times_line([(130.0, 30.0)]) == "Training time per job: 130-130 s; evaluation 30-30 s."
    assert _times_line([(float("nan"), float("nan"))]) == "Training and evaluation times were not recorded."


@pytest.mark.parametrize("spec", ["modsum", "flipflop:p_ignore=0.9"])
def test_a_task_where_a_text_corpus_is_needed_is_one_line(spec):
    from posenc.data.corpora import load_corpus, load_tokens

    for load in (load_corpus, load_tokens):  # finetune and extend read load_corpus, text commands load_tokens
        with pytest.raises(
            PosencError,
            match=rf"corpus '{spec}' is a synthetic task \(posenc.data.tasks\); this command needs a text corpus$",
        ):
            load(spec)


def test_a_task_report_covers_every_task_the_run_holds(tmp_path):
    """--tasks flipflop, then --tasks mqar into the same run: report.md keeps flipflop's section (it had mqar's
    only)."""
    from posenc.jobs.retrieval import task_meta
    from posenc.reports.tasks import write_task_report
    from posenc.store.records import append

    mqar = "mqar:pairs=2,keys=4,values=4,filler=2,gap=0-8"
    for r in task_records("flipflop", {"rope": {0: gap_cells(0.99, {8: 0.9})}}) + task_records(
        mqar, {"rope": {0: gap_cells(0.95, {8: 0.8})}}
    ):
        append(tmp_path / "results.jsonl", r)
    model = {"n_layer": 1, "n_head": 2, "d_model": 32, "train_length": 128}
    meta = task_meta(
        load_preset(str(_tiny_preset(tmp_path, tasks=[mqar], model=model)))
    )  # this invocation's tasks only
    text = write_task_report(tmp_path, meta).read_text()
    assert f"## {mqar}" in text and "## flipflop" in text
    assert text.index("## flipflop") > text.index(f"## {mqar}")  # this invocation's first, then the others


def test_budget_reads_the_learning_curve():
    steps = range(
        20, 620, 20
    )  # 30 logged steps: the last 3 against the 3 ending at step 440 (a quarter of 580 steps earlier)
    falling = [(s, 1.0 - s / 1000) for s in steps]
    assert (
        budget(task_job(falling), 0.5)
        == "loss still falling at the step cap 600 (0.580 -> 0.420 over its last 160 steps): more steps"
    )
    at_chance = [(s, 0.69) for s in steps]
    assert budget(task_job(at_chance), 0.5) == (
        "loss flat at chance at the step cap 600 (0.690; ln 2 = 0.693): "
        "a plateau, not extended (the rule extends a falling loss): more steps untested, or another learning rate or "
        "head count"
    )
    stuck = [(s, 0.30) for s in steps]
    assert (
        budget(task_job(stuck), 0.5) == "loss flat at 0.300 at the step cap 600 (chance 0.693): "
        "another setting (learning rate, heads), not more steps"
    )
    assert budget(task_job(at_chance), 1 / 8).startswith(
        "loss flat at 0.690 at the step cap 600 (chance 2.079)"
    )  # ln 8 for 8 values
    assert budget(task_job(None), 0.5) == budget(task_job(falling[:3]), 0.5) == "no loss curve in the records"


def test_gate_leak_is_minus_log_f_of_each_head():
    """Gates with zero weights and per-head biases b leak -log sigmoid(b) = softplus(-b) per token at every position."""
    from posenc.eval.tasks import gate_leak
    from posenc.model import ModelConfig, build_model

    task = get_task("flipflop")
    biases = [[1.0, 3.0], [2.0, 5.0]]
    for spec, scale in (("forget", 1.0), ("rope+forget:scaled=true", 1 / 4)):  # head_dim 16
        model = build_model(
            ModelConfig(vocab_size=task.vocab_size, n_layer=2, n_head=2, d_model=32, train_length=16, encoding=spec)
        )
        gates = [m for m in model.modules() if m.__class__.__name__ == "ForgetGate"]
        with torch.no_grad():
            for gate, b in zip(gates, biases):
                gate.gate.weight.zero_()
                gate.gate.bias.copy_(torch.tensor(b))
        got = gate_leak(model, task, 16)
        want = [
            [scale * float(torch.nn.functional.softplus(-torch.tensor(v, dtype=torch.float64))) for v in row]
            for row in biases
        ]
        assert np.allclose(got, want, rtol=1e-6, atol=0)
    rope = build_model(
        ModelConfig(vocab_size=task.vocab_size, n_layer=1, n_head=2, d_model=32, train_length=16, encoding="rope")
    )
    assert gate_leak(rope, task, 16) is None


def test_task_csv_round_trips_and_a_csv_before_its_job_columns_loads(tmp_path):
    from posenc.reports.tasks import write_csv
    from posenc.store.records import load_task_csv, load_tasks

    recs = task_records("flipflop", {"rope": {0: gap_cells(0.99, {8: 0.9})}, "path": {1: gap_cells(0.9, {8: 0.8})}})
    recs[0] = recs[0].model_copy(update={"trained_steps": 350, "criterion_step": 350})
    write_csv(tmp_path / "retrieval.csv", recs)
    back = load_tasks(tmp_path)
    assert [(r.scheme, r.seed, r.train_length, r.trained_steps, r.criterion_step) for r in back] == [
        ("rope", 0, 128, 350, 350),
        ("path", 1, 128, None, None),
    ]
    assert [c.model_dump() for c in back[0].cells] == [c.model_dump() for c in recs[0].cells]
    committed = load_task_csv(ROOT / "results" / "retrieval" / "retrieval.csv")  # the committed table reads back
    assert {r.train_length for r in committed} == {128} and len({(r.task, r.scheme, r.seed) for r in committed}) == len(
        committed
    )
    assert {r.task for r in committed} == {"flipflop", "mqar:pairs=4,keys=8,values=8,filler=16,gap=0-64"}
    (tmp_path / "bad.csv").write_text("a,b\n1,2\n")
    with pytest.raises(PosencError, match="bad.csv is not a posenc retrieval table"):
        load_task_csv(tmp_path / "bad.csv")


def test_a_task_job_records_its_heads_loss_curve_and_gate_leak(tmp_path):
    from posenc.eval.tasks import gate_leak
    from posenc.jobs.job import Plan
    from posenc.store.records import RunStore
    from posenc.train.rundir import load_run

    train = {"steps": 4, "batch_size": 4, "lr": 3e-3, "warmup": 1, "loss": "answers", "ckpt_every": 2, "log_every": 1}
    preset = load_preset(str(_tiny_preset(tmp_path, tasks=["flipflop"], schemes=["forget", "rope"], train=train)))
    plan = Plan(preset, tmp_path / "runs")
    for scheme in preset.schemes:
        plan.job("flipflop", scheme, 0).run(RunStore(plan.run_root / "results.jsonl"))
    recs = {r["scheme"]: Task(**r) for r in read_jsonl(plan.run_root / "results.jsonl")}
    run = plan.run_root / "flipflop" / "forget" / "seed0"
    assert recs["forget"].n_head == 2 and recs["forget"].loss_curve == [
        (r["step"], r["loss"]) for r in read_jsonl(run / "train.jsonl")
    ]
    assert [s for s, _ in recs["forget"].loss_curve] == [1, 2, 3, 4]
    assert (
        recs["forget"].leak == gate_leak(load_run(run)[0], get_task("flipflop"), 32)
        and len(recs["forget"].leak[0]) == 2
    )
    assert recs["rope"].leak is None


def test_per_seed_values_are_in_seed_order_whatever_order_the_jobs_finished():
    curves = {
        0: gap_cells(1.0, {8: 1.0, 16: 0.5}),
        1: gap_cells(1.0, {8: 1.0, 16: 1.0, 32: 0.5}),
        2: gap_cells(1.0, {8: 0.5}),
    }
    finished = {"path": {2: curves[2], 0: curves[0], 1: curves[1]}}  # --parallel: the order jobs ended
    t = task_table("flipflop", finished)
    assert list(t.scores["path"]) == [0, 1, 2]
    assert t.horizons("path") == [8, 16, None]


@pytest.mark.parametrize("spec", ["flipflop", "mqar:pairs=2,keys=4,values=4,filler=2,gap=0-16"])
def test_a_screened_evaluation_completed_equals_one_full_evaluation(spec):
    """A sweep screens a grid point at the training length, then completes the chosen one: the cells are those of one
    evaluation of every test, in its order (each test is drawn from a seed of its own)."""
    from posenc import build_model
    from posenc.eval.tasks import evaluate_task

    task = get_task(spec)
    torch.manual_seed(0)
    model = build_model({"vocab_size": task.vocab_size, "n_layer": 1, "n_head": 2, "d_model": 16, "train_length": 16})
    args = (model, task, 16)
    screened = evaluate_task(*args, [1], 40, 1024, 512, only=("id",))
    assert {(r["test"], r["length"]) for r in screened} == {("id", 16)}
    full = evaluate_task(*args, [1, 4], 40, 1024, 512)
    assert evaluate_task(*args, [1, 4], 40, 1024, 512, done=screened) == full
    assert len(full) > len(screened) and all(r in full for r in screened)
    marked = [dict(r, nll=-1.0) for r in screened]  # kept, not scored again
    kept = evaluate_task(*args, [1, 4], 40, 1024, 512, done=marked)
    assert [r for r in kept if r["nll"] == -1.0] == marked and len(kept) == len(full)
