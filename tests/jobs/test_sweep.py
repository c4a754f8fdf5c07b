"""A sweep survives broken schemes: a NaN loss and a killed process fail alone; reruns resume.

The broken schemes live in a plugin module written to a temporary directory
(on sys.path), so the spawned job processes register them by importing it; the
fixture unregisters them afterwards so no other test sees them.
"""

import importlib
import json
import sys

import pytest

from posenc import encodings
from posenc.cli.main import main
from posenc.config.plan import load_preset
from posenc.errors import PosencError
from posenc.jobs.compare import compare
from posenc.store.checkpoint import drop_torn_tail

PLUGIN = '''
import os, signal
import torch
from posenc.encodings import register
from posenc.encodings.base import Encoding


@register
class NaNPhases(Encoding):
    """test-only: phases are NaN, so the loss is NaN at the first step"""
    name = "test-nan"
    rotary = True
    def phases(self, inp):
        return torch.full((1, 1, inp.x.shape[1], self.dims.head_dim // 2), float("nan"))


@register
class Killed(Encoding):
    """test-only: the process is killed (as by the out-of-memory killer)"""
    name = "test-kill"
    rotary = True
    def phases(self, inp):
        os.kill(os.getpid(), signal.SIGKILL)
'''
BROKEN = ["test-nan", "test-kill"]


@pytest.fixture
def broken_schemes(tmp_path, monkeypatch):
    plugin_dir = tmp_path / "plugin"
    plugin_dir.mkdir()
    (plugin_dir / "posenc_broken_plugin.py").write_text(PLUGIN)
    monkeypatch.syspath_prepend(str(plugin_dir))
    importlib.import_module("posenc_broken_plugin")
    yield
    for name in BROKEN:
        encodings.unregister(name)
    sys.modules.pop("posenc_broken_plugin", None)


@pytest.fixture
def corpus(tiny_corpus):
    return tiny_corpus


def tiny_preset(corpus, schemes):
    return load_preset(
        "quick",
        {
            "name": "sweep",
            "schemes": schemes,
            "model": {"n_layer": 1, "n_head": 2, "d_model": 16, "train_length": 16},
            "train": {"corpus": str(corpus), "steps": 4, "batch_size": 2, "ckpt_every": 2, "threads": 1},
            "eval": {"multiples": [1, 2], "max_tokens": 64, "passkey": {"trials": 0}, "far_mass": {"windows": 0}},
        },
    )


@pytest.mark.slow
def test_broken_schemes_fail_alone_and_rerun_resumes(broken_schemes, corpus, tmp_path, capsys):
    preset = tiny_preset(corpus, ["rope", *BROKEN])
    report, failures = compare(preset, tmp_path / "runs")
    assert sorted(failures) == ["test-kill (seed 0)", "test-nan (seed 0)"]
    err = capsys.readouterr().err
    run = tmp_path / "runs" / "sweep"
    records = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    ppl = [r for r in records if r["kind"] == "ppl"]
    assert sorted((r["scheme"], r["eval_length"]) for r in ppl) == [("rope", 16), ("rope", 32)]
    assert all(1 < r["ppl"] < 300 for r in ppl)
    text = report.read_text()
    assert "loss is nan at step 0; last good checkpoint: none yet" in text
    assert "job process died: SIGKILL (out of memory?)" in text
    for name in BROKEN:  # one line each on stderr, the traceback in a file
        line = next(x for x in err.splitlines() if x.startswith(f"posenc: {name} (seed 0) failed: "))
        assert "Traceback" not in line
        assert (run / name / "seed0.error.txt").exists()
    assert "Traceback" in (run / "test-nan" / "seed0.error.txt").read_text()

    # a rerun (here in-process) skips finished jobs (no new records) and retries the failed ones
    with open(run / "results.jsonl", "ab") as f:
        f.write(b'{"kind": "ppl", "scheme": "ro')  # a record torn by a kill mid-write
    compare(tiny_preset(corpus, ["rope", "test-nan"]), tmp_path / "runs", isolate=False)
    after = [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()]
    assert after == records
    assert "posenc: test-nan (seed 0) failed" in capsys.readouterr().err


def test_interrupted_evaluation_resumes(corpus, tmp_path):
    preset = tiny_preset(corpus, ["rope"])
    compare(preset, tmp_path / "runs", isolate=False)
    results = tmp_path / "runs" / "sweep" / "results.jsonl"
    lines = results.read_text().splitlines()
    assert [json.loads(line)["eval_length"] for line in lines[:2]] == [16, 32]
    results.write_text(lines[0] + "\n" + lines[1][:20])  # killed while writing the second record
    compare(preset, tmp_path / "runs", isolate=False)
    again = results.read_text().splitlines()
    assert again[0] == lines[0] and json.loads(again[1])["eval_length"] == 32 and len(again) == len(lines)


def testdrop_torn_tail(tmp_path):
    p = tmp_path / "r.jsonl"
    p.write_bytes(b'{"a": 1}\n{"b"')
    drop_torn_tail(p)
    assert p.read_bytes() == b'{"a": 1}\n'
    drop_torn_tail(p)
    assert p.read_bytes() == b'{"a": 1}\n'


def test_rerun_with_other_settings_is_refused(corpus, tmp_path, monkeypatch):
    """Reruns skip finished jobs, so a changed budget would relabel old results: refused before any work."""
    compare(tiny_preset(corpus, ["rope"]), tmp_path / "runs", isolate=False)
    run = tmp_path / "runs" / "sweep"
    before = {p: p.read_bytes() for p in (run / "preset.json", run / "results.jsonl", run / "report.md")}
    changed = tiny_preset(corpus, ["rope"]).model_copy(deep=True)
    changed.train.steps = 3
    with pytest.raises(
        PosencError, match=r"holds results made with other settings \(train.steps 4 -> 3\); use another --name or --out"
    ):
        compare(changed, tmp_path / "runs", isolate=False)
    assert {p: p.read_bytes() for p in before} == before
    grown = tiny_preset(corpus, ["rope", "alibi"]).model_copy(deep=True)  # more cells, memory knobs: allowed
    grown.eval.far_mass.multiples = [2, 4]
    grown.eval.passkey.depths = [0.5, 0.9]
    grown.train.threads, grown.model.attn_block_size = 2, 8
    monkeypatch.chdir(corpus.parent)
    grown.train.corpus = f"./{corpus.name}/"  # the same corpus, spelled relative to the working directory
    _, failures = compare(grown, tmp_path / "runs", isolate=False)
    assert failures == {}
    assert json.loads((run / "preset.json").read_text())["train"]["corpus"] == str(corpus.resolve())


@pytest.mark.parametrize("name", ["../escape", "", "a/b", ".."])
def test_run_name_must_be_a_plain_directory_name(name, capsys):
    assert main(["compare", "--preset", "quick", "--name", name]) == 2
    err = capsys.readouterr().err.strip()
    shown = name or "''"  # an empty value is shown quoted
    assert err.startswith(f"posenc: error: invalid name={shown} (command line):") and len(err.splitlines()) == 1


def test_compare_exit_status_is_1_when_a_job_failed(broken_schemes, corpus, tmp_path, capsys, monkeypatch):
    preset = tmp_path / "p.yaml"
    preset.write_text(json.dumps(tiny_preset(corpus, ["rope", "test-nan"]).model_dump(mode="json")))
    assert main(["compare", "--preset", str(preset), "--out", str(tmp_path / "runs"), "--no-isolate"]) == 1
    assert "posenc: 1 job(s) failed: test-nan (seed 0)" in capsys.readouterr().err


def test_too_short_held_out_text_fails_before_training(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("to be or not to be " * 40)
    code = main(
        [
            "compare",
            "--preset",
            "quick",
            "--schemes",
            "rope",
            "--steps",
            "2",
            "--corpus",
            str(corpus),
            "--out",
            str(tmp_path / "o"),
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("posenc: error: corpus too small: its held-out text has ")
    assert err[-1].endswith(" one window of evaluation length 256 needs 257 tokens in one document")
    assert not (tmp_path / "o").exists()


def test_a_run_none_of_whose_jobs_finished_exits_2_with_one_line_each(broken_schemes, corpus, tmp_path, capsys):
    """As when no job can allocate its model (--set model.d_model=1000000000): no report to write, no traceback."""
    preset = tmp_path / "p.yaml"
    preset.write_text(json.dumps(tiny_preset(corpus, ["test-nan"]).model_dump(mode="json")))
    assert main(["compare", "--preset", str(preset), "--out", str(tmp_path / "runs"), "--no-isolate"]) == 2
    run = tmp_path / "runs" / "sweep"
    lines = [x for x in capsys.readouterr().err.splitlines() if x.startswith(("posenc: test-nan", "posenc: error"))]
    assert lines[0].startswith("posenc: test-nan (seed 0) failed: PosencError: loss is nan at step 0") and lines[
        1:
    ] == [f"posenc: error: no job finished (1 failed, each said above); the records are kept in {run}"]
    assert (run / "test-nan" / "seed0.error.txt").exists() and not (run / "report.md").exists()
