"""Passkey retrieval: exact input length, key depth, rank scoring with an oracle, per-cell accuracy; compare report."""

import json
import re

import numpy as np
import pytest
import torch

from posenc import build_model
from posenc.config.plan import load_preset
from posenc.data.corpora import ByteTokenizer
from posenc.errors import PosencError
from posenc.eval.passkey import NEEDLE, QUESTION, PasskeyConfig, draw_keys, make_sample, passkey_records
from posenc.jobs.compare import compare

TOK = ByteTokenizer()
BASE = {"scheme": "rope", "seed": 0, "train_length": 32}  # the run fields each record carries


@pytest.mark.parametrize("length", [110, 300, 1024])
@pytest.mark.parametrize("depth", [0.0, 0.3, 0.5, 1.0])
def test_sample_has_exact_length_and_key_at_depth(length, depth):
    key = "04719"
    s = make_sample(TOK, length, depth, key)
    assert s.tokens.shape == (length + 1,) and s.key_len == 5  # the model reads exactly `length` tokens
    text = TOK.decode(s.tokens)
    needle = NEEDLE.format(key=key)
    assert text.index(needle) == s.needle_start and text.endswith(QUESTION + key)
    n_fill = length + 1 - len(needle) - len(QUESTION) - len(key)
    assert s.needle_start == round(depth * n_fill)
    assert abs(s.needle_start / length - depth) <= (len(needle) + len(QUESTION) + len(key)) / length


def test_too_short_length_is_one_line_error():
    with pytest.raises(PosencError, match="passkey length 50 is shorter than the needle and question"):
        make_sample(TOK, 50, 0.5, "12345")


def test_keys_are_distinct_digit_strings():
    keys = draw_keys(np.random.default_rng(0), TOK, 8, 5)
    assert len(set(keys)) == 8 and all(re.fullmatch(r"\d{5}", k) for k in keys)


def _model():
    return build_model({"n_layer": 1, "n_head": 2, "d_model": 16, "train_length": 32, "encoding": "rope"})


def _fake_nll(prefer):
    """token_nll whose key continuation costs 0 where ``prefer(hidden key, row)`` is True, else 1 per token."""

    def token_nll(tokens, targets):
        assert tokens.shape == targets.shape
        nll = torch.full(tokens.shape, 3.0)
        for row in range(tokens.shape[0]):
            text = TOK.decode(tokens[row].tolist() + targets[row, -1:].tolist())
            hidden = re.search(r"The pass key is (\d+)\.", text).group(1)
            nll[row, -len(hidden) :] = 0.0 if prefer(hidden, row) else 1.0
        return nll

    return token_nll


def test_oracle_scores_every_trial_and_cells_count_trials(monkeypatch):
    model = _model()
    seen = []

    def oracle(hidden, row):
        seen.append(row)
        return row == 0  # the true key is the first candidate of each batch

    monkeypatch.setattr(model, "token_nll", _fake_nll(oracle))
    cfg = PasskeyConfig(lengths_multiples=[4, 8], depths=[0.0, 0.5, 1.0], trials=3, candidates=6)
    recs = list(passkey_records(model, TOK, cfg, BASE))
    assert [(r.length, r.depth) for r in recs] == [(L, d) for L in (128, 256) for d in (0.0, 0.5, 1.0)]
    assert all(
        r.trials == 3 and r.correct == 3 and r.accuracy == 1.0 and r.candidates == 6 and r.scheme == "rope"
        for r in recs
    )
    assert len(seen) == 6 * 3 * 6  # cells x trials x candidates
    # done cells are skipped; a model preferring a wrong key, or a tie, scores 0
    monkeypatch.setattr(model, "token_nll", _fake_nll(lambda hidden, row: row == 1))
    recs = list(passkey_records(model, TOK, cfg, BASE, done={(128, 0.0), (128, 0.5), (128, 1.0)}))
    assert [r.length for r in recs] == [256] * 3 and all(r.accuracy == 0.0 for r in recs)
    monkeypatch.setattr(model, "token_nll", _fake_nll(lambda hidden, row: True))
    assert all(r.correct == 0 for r in passkey_records(model, TOK, cfg, BASE))


def test_the_prompt_hides_the_true_key(monkeypatch):
    """The candidate batch shares one prompt with the true key in its needle; only the continuations differ."""
    model = _model()
    batches = []

    def record(tokens, targets):
        batches.append(torch.cat([tokens, targets[:, -1:]], dim=1))
        return torch.zeros(tokens.shape)

    monkeypatch.setattr(model, "token_nll", record)
    list(passkey_records(model, TOK, PasskeyConfig(lengths_multiples=[8], depths=[0.5], trials=1, candidates=5), BASE))
    b = batches[0]
    assert b.shape == (5, 257) and (b[:, :-5] == b[0, :-5]).all()
    texts = [TOK.decode(r.tolist()) for r in b]
    true_key = re.search(r"The pass key is (\d+)\.", texts[0]).group(1)
    assert texts[0].endswith(true_key) and len({t[-5:] for t in texts}) == 5


def test_learned_table_too_short_is_na():
    model = build_model({"n_layer": 1, "n_head": 2, "d_model": 16, "train_length": 128, "encoding": "learned"})
    recs = list(passkey_records(model, TOK, PasskeyConfig(lengths_multiples=[1, 2], depths=[0.5], trials=1), BASE))
    assert recs[0].trials == 1 and recs[1].accuracy is None and recs[1].note.startswith("n/a")


@pytest.mark.slow
def test_compare_report_has_passkey_column_heat_map_and_far_mass(tmp_path):
    preset = tmp_path / "pk.yaml"
    preset.write_text(
        "name: pk\nmodel: {n_layer: 1, n_head: 2, d_model: 32, train_length: 32}\n"
        "train: {steps: 3, batch_size: 4, warmup: 1, threads: 1}\n"
        "eval: {multiples: [1, 2], max_tokens: 256, "
        "passkey: {lengths_multiples: [4, 8], depths: [0.25, 0.75], trials: 2, candidates: 3},"
        " far_mass: {multiples: [2, 4], windows: 1}}\n"
        "schemes: [rope, alibi]\n"
    )
    compare(load_preset(str(preset)), tmp_path, isolate=False)
    run = tmp_path / "pk"
    records = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    pk = [r for r in records if r["kind"] == "passkey"]
    assert sorted((r["scheme"], r["length"], r["depth"]) for r in pk) == sorted(
        (s, L, d) for s in ("rope", "alibi") for L in (128, 256) for d in (0.25, 0.75)
    )
    assert all(r["trials"] == 2 and r["correct"] in (0, 1, 2) and r["accuracy"] == r["correct"] / 2 for r in pk)
    fm = [r for r in records if r["kind"] == "far_mass"]
    assert sorted((r["scheme"], r["length"]) for r in fm) == [
        ("alibi", 64),
        ("alibi", 128),
        ("rope", 64),
        ("rope", 128),
    ]
    assert all(0 < r["far_mass_mean"] < 1 for r in fm)
    report = (run / "report.md").read_text()
    assert "| passkey @ 256 |" in report and "## Passkey retrieval" in report and "## Far attention mass" in report
    rope_acc = sum(r["correct"] for r in pk if r["scheme"] == "rope" and r["length"] == 256) / 4
    assert f"| {rope_acc:.2f} (n=4) |" in report
    for name in ("passkey.png", "far_mass.png"):
        assert (run / name).stat().st_size > 0
    before = (run / "results.jsonl").read_text()
    compare(load_preset(str(preset)), tmp_path, isolate=False)  # rerun: nothing re-evaluated
    assert (run / "results.jsonl").read_text() == before


def test_generation_prompt_is_task_then_whole_sentences():
    """The Hugging Face prompt: task, filler sentences, needle after round(depth * n) of them, question."""
    from posenc.eval.passkey import FILLER, TASK, passkey_prompt

    words = lambda text, **_: {"input_ids": text.split()}  # noqa: E731
    ids, text = passkey_prompt(words, 120, 0.25, 12345)
    n = text.count(FILLER)
    parts = [
        TASK,
        *[FILLER.strip()] * round(n * 0.25),
        "The pass key is 12345. Remember it. 12345 is the pass key.",
        *[FILLER.strip()] * (n - round(n * 0.25)),
        QUESTION.strip(),
    ]
    assert text == " ".join(parts) and ids == text.split() and 120 - 19 < len(ids) <= 120 and n == 3


def test_a_preset_without_eval_passkey_scores_no_passkey(tmp_path):
    """Leaving eval.passkey out means off; a block given takes PasskeyConfig's defaults for the keys it leaves out."""
    from posenc.jobs.job import TextJob

    base = (
        "name: p\nmodel: {n_layer: 1, n_head: 2, d_model: 32, train_length: 32}\ntrain: {steps: 1}\nschemes: [rope]\n"
    )
    without = tmp_path / "without.yaml"
    without.write_text(base + "eval: {far_mass: {windows: 0}}\n")
    ev = load_preset(str(without)).eval
    assert ev.passkey.trials == 0
    preset = load_preset(str(without))
    job = TextJob(preset, tmp_path, "rope", 0, preset.model, preset.train)
    assert job.extras() == set()  # nothing left to score
    given = tmp_path / "given.yaml"
    given.write_text(base + "eval: {passkey: {depths: [0.5]}}\n")
    assert load_preset(str(given)).eval.passkey.trials == PasskeyConfig().trials > 0
    assert load_preset("retrieval").eval.passkey.trials == 0


def test_a_description_is_flagged_with_the_settings_a_run_overrides(tmp_path):
    """retrieval's description says 4,000 steps and 2 heads; a run with --steps 30 says it sets train.steps = 30."""
    from posenc.jobs.retrieval import task_meta

    preset = load_preset("retrieval", {"train": {"steps": 30}})
    assert preset.description.endswith("[The preset as written; this run sets train.steps = 30.]")
    assert task_meta(preset)["notes"] == preset.description
    assert "this run sets" not in load_preset("retrieval").description
    custom = tmp_path / "heads.yaml"
    custom.write_text(
        "name: h\ndescription: 1 layer, 2 heads\nmodel: {n_layer: 1, n_head: 2, d_model: 32, train_length: 32}\n"
        "train: {steps: 1}\nschemes: [rope]\n"
    )
    assert (
        load_preset(str(custom), {"train": {"steps": 5}}).description
        == "1 layer, 2 heads [The preset as written; this run sets train.steps = 5.]"
    )
