"""The typed run records and their one store: round trips, files of earlier releases, newer versions refused,
torn tails, the committed CSV tables."""

import json
import math
from pathlib import Path

import pytest

from posenc.cli.main import main
from posenc.errors import PosencError
from posenc.reports.text import write_csv
from posenc.store.checkpoint import drop_torn_tail
from posenc.store.records import (
    DIAGNOSE,
    PRETRAINED,
    RUN,
    SCHEMA_VERSION,
    Diagnosis,
    FarMass,
    LayerGap,
    LengthDiagnosis,
    PasskeyCell,
    PasskeyTrial,
    Ppl,
    RunStore,
    ScoredWindow,
    Task,
    TaskCell,
    append,
    load,
    load_csv,
    load_ppl,
    trial_key,
    write,
)

RESULTS = Path(__file__).resolve().parents[2] / "results"

RUN_RECORDS = [
    Ppl(
        scheme="rope",
        seed=0,
        train_length=128,
        eval_length=256,
        windows=4,
        scored_tokens=1024,
        nll=2900.5,
        ppl=math.exp(2900.5 / 1024),
        bucket_edges=[0, 128, 256],
        bucket_ppl=[15.0, 19.0],
        seconds=1.5,
    ),
    Ppl(scheme="rope", seed=0, train_length=128, eval_length=8192, windows=0, scored_tokens=0, note="n/a: too long"),
    PasskeyCell(
        scheme="alibi",
        seed=1,
        train_length=128,
        length=512,
        depth=0.25,
        mode="rank",
        candidates=8,
        digits=5,
        trials=8,
        correct=3,
        accuracy=0.375,
        seconds=2.0,
    ),
    FarMass(
        scheme="alibi",
        seed=1,
        train_length=128,
        length=512,
        windows=2,
        far_mass_mean=0.01,
        entropy_mean=1.2,
        uniform_far_mass=0.6,
        uniform_entropy=5.4,
        w=128,
    ),
    FarMass(scheme="pope", seed=0, train_length=128, length=512, note="not supported: no softmax"),
    Task(
        task="flipflop",
        scheme="rope",
        seed=0,
        train_length=128,
        train_seconds=10.0,
        eval_seconds=1.0,
        threads=2,
        cells=[TaskCell(test="id", length=128, bucket=8, n=100, correct=97, nll=3.5)],
    ),
]
PRETRAINED_RECORDS = [
    ScoredWindow(
        key="ppl|none|16|doc|0",
        adaptation="none",
        factor=2.0,
        length=16,
        stride=15,
        bos="none",
        doc="doc",
        begin=0,
        bucket=1024,
        signature="ab12",
        seconds=0.1,
        nll_sum=40.0,
        n_scored=15,
        bucket_nll=[40.0],
        bucket_n=[15],
        reused_from="pi",
        setting="t",
    ),
    PasskeyTrial(
        key=trial_key("yarn", 120, 0.5, 1),
        adaptation="yarn",
        factor=2.0,
        length=120,
        depth=0.5,
        trial=1,
        seconds=0.3,
        passkey=12345,
        answer="12345",
        got=12345,
        correct=True,
        prompt_tokens=117,
        setting="t",
    ),
]

DIAGNOSE_RECORDS = [
    Diagnosis(
        scheme="acc-rand-qkv",
        describe="accumulated(...)",
        train_length=16,
        w=16,
        windows_per_length=1,
        lengths=[
            LengthDiagnosis(
                length=16, multiple=1.0, windows=1, entropy=[[1.5, 1.6]], entropy_mean=1.55, uniform_entropy=1.9
            ),
            LengthDiagnosis(
                length=32,
                multiple=2.0,
                windows=1,
                far_mass=[[0.25, 0.5]],
                far_mass_bound=[[0.1, 0.2]],
                entropy=[[2.0, 2.1]],
                far_mass_mean=0.375,
                entropy_mean=2.05,
                uniform_far_mass=0.4,
                uniform_entropy=2.5,
            ),
            LengthDiagnosis(length=64, multiple=4.0, windows=0, note="n/a: too long"),
        ],
        spectral_gap=[LayerGap(layer=0, steps=45, beta=[[1.0, 0.5]], baseline=[0.84, 0.84], mean_step=[[0.0, 0.1]])],
    ),
    Diagnosis(
        scheme="path",
        describe="path",
        train_length=16,
        w=16,
        windows_per_length=2,
        note="not supported: no softmax",
    ),
]


@pytest.mark.parametrize(
    "kinds, recs", [(RUN, RUN_RECORDS), (PRETRAINED, PRETRAINED_RECORDS), (DIAGNOSE, DIAGNOSE_RECORDS)]
)
def test_every_kind_round_trips(tmp_path, kinds, recs):
    path = tmp_path / "r.jsonl"
    for r in recs:
        append(path, r)
    assert load(path, kinds) == recs
    assert all(json.loads(line)["schema_version"] == SCHEMA_VERSION for line in path.read_text().splitlines())


def test_write_replaces_the_file(tmp_path):
    """posenc diagnose rewrites its diagnose.jsonl whole: a rerun leaves its own record only."""
    path = tmp_path / "diagnose.jsonl"
    write(path, DIAGNOSE_RECORDS)
    write(path, DIAGNOSE_RECORDS[1:])
    assert load(path, DIAGNOSE) == DIAGNOSE_RECORDS[1:] and len(path.read_text().splitlines()) == 1


def test_ratio_is_derived_not_stored(tmp_path):
    append(tmp_path / "r.jsonl", RUN_RECORDS[0].model_copy(update={"ratio": 1.3}))
    assert "ratio" not in json.loads((tmp_path / "r.jsonl").read_text())
    assert load(tmp_path / "r.jsonl")[0].ratio is None


def test_a_version_1_file_loads(tmp_path):
    """Lines as posenc wrote them before the schema field: compare's and eval's (no kind)."""
    lines = [
        {
            "kind": "ppl",
            "scheme": "rope",
            "seed": 0,
            "train_length": 128,
            "eval_length": 128,
            "windows": 2,
            "scored_tokens": 256,
            "nll": 700.0,
            "ppl": math.exp(700.0 / 256),
            "bucket_edges": [0, 128],
            "bucket_ppl": [15.4],
            "seconds": 1.0,
        },
        {
            "scheme": "alibi",
            "train_length": 128,
            "eval_length": 256,
            "windows": 1,
            "scored_tokens": 256,
            "nll": 710.0,
            "ppl": math.exp(710.0 / 256),
            "bucket_edges": [0, 256],
            "bucket_ppl": [16.0],
        },
        {"kind": "far_mass", "scheme": "rope", "seed": 0, "train_length": 128, "length": 256, "note": "not supported"},
    ]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    got = load(tmp_path / "results.jsonl")
    assert [type(r) for r in got] == [Ppl, Ppl, FarMass] and {r.schema_version for r in got} == {1}
    assert (got[1].scheme, got[1].seed, got[1].ppl) == ("alibi", None, math.exp(710.0 / 256))


def test_a_line_with_a_field_renamed_before_the_first_release_is_refused_in_one_line(tmp_path):
    """Version 2 renamed the row label of extend's and finetune's records from method to adaptation; nothing was
    released before, so no shim reads the old name: the line is refused, naming the missing field."""
    path = tmp_path / "records.jsonl"
    row = PRETRAINED_RECORDS[0].model_dump(mode="json")
    old = {**{("method" if k == "adaptation" else k): v for k, v in row.items()}, "schema_version": 1}
    path.write_text(json.dumps(old) + "\n")
    with pytest.raises(PosencError, match=r"line 1: not a ppl record \(adaptation: Field required\)"):
        load(path, PRETRAINED)


def test_a_newer_pretrained_line_is_refused_with_one_line(tmp_path):
    path = tmp_path / "records.jsonl"
    path.write_text(
        json.dumps(PRETRAINED_RECORDS[1].model_dump(mode="json") | {"schema_version": SCHEMA_VERSION + 1}) + "\n"
    )
    with pytest.raises(PosencError) as exc:
        load(path, PRETRAINED)
    assert str(exc.value) == (
        f"{path} line 1 holds records of schema version {SCHEMA_VERSION + 1}; this posenc reads "
        f"versions up to {SCHEMA_VERSION} (a newer posenc wrote it)"
    )


def test_a_newer_version_is_refused_with_one_line(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    rec = RUN_RECORDS[0].model_dump(mode="json", exclude={"ratio"}) | {"schema_version": SCHEMA_VERSION + 1}
    (run / "results.jsonl").write_text(json.dumps(rec) + "\n")
    with pytest.raises(PosencError, match=f"results.jsonl line 1 holds records of schema version {SCHEMA_VERSION + 1}"):
        load(run / "results.jsonl")
    assert main(["report", str(run), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        f"posenc: error: {run / 'results.jsonl'} line 1 holds records of schema version {SCHEMA_VERSION + 1}"
    )
    assert len(err.splitlines()) == 1


def test_unknown_kinds_and_misfit_fields_are_one_line_errors(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps({"kind": "bogus"}) + "\n")
    with pytest.raises(
        PosencError, match="line 1 holds a record of unknown kind 'bogus'; known: ppl, passkey, far_mass, task"
    ):
        load(path)
    path.write_text(json.dumps({"kind": "task", "scheme": "rope"}) + "\n")
    with pytest.raises(PosencError, match=r"line 1: not a task record \(task: Field required\)"):
        load(path)
    path.write_text(json.dumps({"kind": "far_mass", "scheme": "rope", "length": 64, "typo": 1}) + "\n")
    with pytest.raises(PosencError, match=r"not a far_mass record \(typo: Extra inputs are not permitted\)"):
        load(path)


def test_a_torn_tail_is_dropped(tmp_path, capsys):
    path = tmp_path / "results.jsonl"
    append(path, RUN_RECORDS[0])
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"kind": "ppl", "sch')  # killed mid-write
    assert load(path) == [RUN_RECORDS[0]]
    assert capsys.readouterr().err == (
        f"posenc: warning: {path} line 2 is cut short (an interrupted append); ignored\n"
    )
    drop_torn_tail(path)
    assert path.read_bytes() == whole
    append(path, RUN_RECORDS[2])
    assert load(path) == [RUN_RECORDS[0], RUN_RECORDS[2]]
    assert load(tmp_path / "missing.jsonl") == []


@pytest.mark.parametrize("name", ["default", "baselines", "learned", "window"])
def test_committed_csv_tables_load_and_write_back_byte_for_byte(tmp_path, name):
    recs = load_csv(RESULTS / name / "results.csv")
    assert recs and all(isinstance(r, Ppl) and r.ratio is not None for r in recs if r.ppl is not None)
    write_csv(tmp_path / "results.csv", recs)
    assert (tmp_path / "results.csv").read_bytes() == (RESULTS / name / "results.csv").read_bytes()
    assert load_ppl(RESULTS / name) == recs


def test_load_ppl_prefers_the_jsonl_and_keeps_only_perplexity(tmp_path):
    assert load_ppl(tmp_path) is None
    for r in RUN_RECORDS:
        append(tmp_path / "results.jsonl", r)
    (tmp_path / "results.csv").write_text("scheme,train_length,eval_length\n")
    assert load_ppl(tmp_path) == RUN_RECORDS[:2]
    (tmp_path / "results.jsonl").unlink()
    assert load_ppl(tmp_path) == []
    (tmp_path / "results.csv").write_text("a,b\n1,2\n")
    with pytest.raises(PosencError, match="results.csv is not a posenc results table"):
        load_ppl(tmp_path)


def test_the_extend_store_counts_each_trial_once_across_reruns(tmp_path):
    """A rerun reopens the store: finished keys are skipped, a key recorded twice counts once, another
    setting's records are kept in the file but not shown."""
    extend = pytest.importorskip("posenc.jobs.extend")
    path = tmp_path / "records.jsonl"
    store = extend._Store(path, "t")
    for r in PRETRAINED_RECORDS:
        store.add(r)
    append(path, PRETRAINED_RECORDS[1])  # an earlier release appended a finished trial again
    append(path, PRETRAINED_RECORDS[1].model_copy(update={"setting": "other"}))
    again = extend._Store(path, "t")
    assert again.records == PRETRAINED_RECORDS
    assert again.done == {r.key for r in PRETRAINED_RECORDS}
    w = PRETRAINED_RECORDS[0]
    assert again.by_sig == {(w.signature, w.doc, w.begin, w.length): w}


def test_a_bad_line_before_the_last_is_refused_naming_file_and_line(tmp_path):
    path = tmp_path / "results.jsonl"
    write(path, RUN_RECORDS[:2])
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(lines[0] + b'{"kind": "ppl", "sch\n' + lines[1])  # a torn record an append went on after
    with pytest.raises(PosencError, match=rf"^{path} line 2 is not a JSON record; repair or remove that line$"):
        load(path)
    with pytest.raises(PosencError, match="line 2 is not a JSON record"):
        RunStore(path)
    path.write_bytes(lines[0] + b"not json\n")  # whole (it ends in a newline): not an interrupted append
    with pytest.raises(PosencError, match="line 2 is not a JSON record"):
        load(path)


def test_report_refuses_a_bad_mid_file_line_and_warns_of_a_torn_last_one(tmp_path, capsys):
    run = tmp_path / "run"
    run.mkdir()
    path = run / "results.jsonl"
    rows = [Ppl(scheme="rope", seed=0, train_length=16, eval_length=L, ppl=p) for L, p in ((16, 9.0), (32, 12.0))]
    write(path, rows)
    whole = path.read_bytes()
    path.write_bytes(whole + b'{"kind": "ppl", "sch')
    assert main(["report", str(run), "--out", str(tmp_path / "out")]) == 0
    out, err = capsys.readouterr()
    assert err == f"posenc: warning: {path} line 3 is cut short (an interrupted append); ignored\n"
    assert "1.33" in out  # 12 / 9 at 2x: both records read
    first, second = whole.splitlines(keepends=True)
    path.write_bytes(first + b'{"kind": "ppl", "sch\n' + second)
    assert main(["report", str(run), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err == f"posenc: error: {path} line 2 is not a JSON record; repair or remove that line\n"


def test_the_run_store_reads_each_byte_once_and_cuts_a_torn_tail(tmp_path, capsys, monkeypatch):
    path = tmp_path / "results.jsonl"
    write(path, RUN_RECORDS[:1])
    path.write_bytes(path.read_bytes() + b'{"kind": "pp')
    read = []
    take = RunStore._take
    monkeypatch.setattr(RunStore, "_take", lambda self, data: read.append(len(data)) or take(self, data))
    store = RunStore(path)
    assert "line 2 is cut short (an interrupted append); removed" in capsys.readouterr().err
    assert store.records == RUN_RECORDS[:1] and path.read_bytes().endswith(b"}\n")  # the next append starts clean
    store.append(RUN_RECORDS[1])
    append(path, RUN_RECORDS[2])  # a job in another process
    assert store.refresh() == RUN_RECORDS[1:3] and store.records == RUN_RECORDS[:3]
    assert store.refresh() == [] and sum(read) == path.stat().st_size  # each byte read once


def test_a_torn_csv_row_is_never_read_as_numbers(tmp_path, capsys):
    """A results.csv whose last row was cut mid-number (ratio column gone) is ignored with a warning, as a torn JSONL
    line; a row with a wrong field count or a number that does not parse before the last is refused naming the line."""
    lines = (RESULTS / "default" / "results.csv").read_bytes().split(b"\r\n")[:3]
    whole = load_csv(RESULTS / "default" / "results.csv")[:2]
    path = tmp_path / "results.csv"
    path.write_bytes(b"\r\n".join(lines[:2]) + b"\r\n" + lines[2][:60])  # killed mid-write: ppl cut, ratio gone
    assert load_csv(path) == whole[:1]
    assert capsys.readouterr().err == f"posenc: warning: {path} line 3 is cut short (an interrupted write); ignored\n"
    path.write_bytes(b"\r\n".join([lines[0], lines[1][:60], lines[2], b""]))
    with pytest.raises(
        PosencError,
        match=rf"^{path} line 2 is not a results row \(8 fields, the header has 10\); repair or remove that line$",
    ):
        load_csv(path)
    path.write_bytes(b"\r\n".join([lines[0], lines[1].replace(b",128,", b",12x,", 1), lines[2], b""]))
    with pytest.raises(PosencError, match=r"line 2 is not a results row \(invalid literal for int"):
        load_csv(path)
