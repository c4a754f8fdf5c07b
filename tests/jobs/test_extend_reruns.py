"""Reruns of the pretrained-model commands count each passkey trial once; their stores, refusals and notices."""

from __future__ import annotations

import json

import pytest

transformers = pytest.importorskip("transformers")

from posenc.cli.main import main  # noqa: E402
from posenc.jobs import extend  # noqa: E402
from posenc.store.records import SCHEMA_VERSION  # noqa: E402


def _lines(out):
    return (out / "records.jsonl").read_text().splitlines()


def _passkey_cells(out):
    return (out / "passkey.csv").read_text()


def test_extend_rerun_counts_each_passkey_trial_once(llama_dir):
    out = llama_dir / "o"
    argv = [
        "extend",
        "--model",
        str(llama_dir / "tiny"),
        "--corpus",
        str(llama_dir / "corpus.txt"),
        "--out",
        str(out),
        "--schedules",
        "none",
        "yarn",
        "--lengths",
        "16",
        "--max-windows",
        "1",
        "--passkey-lengths",
        "120",
        "--trials",
        "2",
        "--scheme",
        "alibi",
    ]
    assert main(argv) == 0
    lines, cells = _lines(out), _passkey_cells(out)
    trials = [json.loads(x) for x in lines if json.loads(x)["kind"] == "passkey"]
    assert len(trials) == 3 * 2 and all(isinstance(r["key"], str) and 10000 <= r["passkey"] <= 99999 for r in trials)
    assert main(argv) == 0  # a rerun: nothing recomputed, every count unchanged
    assert _lines(out) == lines and _passkey_cells(out) == cells
    assert ",2," in cells.splitlines()[1]  # 2 trials per cell, not 4


def test_passkey_schedules_outside_schedules(llama_dir, capsys):
    """A given --passkey-schedules naming a schedule that --schedules leaves out is refused before anything runs; a
    preset's passkey list that --schedules misses runs no trial and says so."""
    out = llama_dir / "w"
    common = ["extend", "--model", str(llama_dir / "tiny"), "--corpus", str(llama_dir / "corpus.txt"), "--out"]
    common += [str(out), "--lengths", "16", "--max-windows", "1", "--passkey-lengths", "120"]
    assert main([*common, "--schedules", "none", "--passkey-schedules", "none", "yarn"]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "posenc: error: --passkey-schedules yarn: not in --schedules (none), so no passkey trial would run on it "
        "(add it to --schedules)"
    ]
    assert not out.exists()
    assert main([*common, "--passkey-lengths", "--schedules", "none", "--passkey-schedules", "none"]) == 2  # none
    assert capsys.readouterr().err == (
        "posenc: error: --passkey-schedules none: no passkey lengths (--passkey-lengths is empty), so no passkey trial "
        "would run\n"
    )
    assert main([*common, "--schedules", "pi"]) == 0  # the default preset's passkey list: none, yarn
    assert (
        "posenc: warning: no schedule of --schedules (pi) is in --passkey-schedules (none yarn)"
        in capsys.readouterr().err
    )
    assert not any(json.loads(x)["kind"] == "passkey" for x in _lines(out))


def test_finetune_rerun_counts_each_passkey_trial_once(llama_dir, capsys):
    pytest.importorskip("peft")
    out = llama_dir / "f"
    argv = [
        "finetune",
        "--model",
        str(llama_dir / "tiny"),
        "--corpus",
        str(llama_dir / "corpus.txt"),
        "--length",
        "32",
        "--steps",
        "2",
        "--eval-lengths",
        "16",
        "--eval-windows",
        "1",
        "--passkey-lengths",
        "120",
        "--trials",
        "2",
        "--scheme",
        "alibi",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    lines, cells = _lines(out), _passkey_cells(out)
    assert sum(json.loads(x)["kind"] == "passkey" for x in lines) == 2 * 2  # before and after training
    capsys.readouterr()
    assert main(argv) == 0
    assert _lines(out) == lines and _passkey_cells(out) == cells
    printed = capsys.readouterr()  # a progress line: on stderr, stdout keeps the results alone
    assert f"posenc: {out} is already fine-tuned (step 2 of 2): training skipped" in printed.err
    assert "already fine-tuned" not in printed.out


def test_a_literal_special_token_in_a_document_is_text(tmp_path):
    """'<s>' written in a document is tokenized as text, not as the BOS id (extend's documents, finetune's stream)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from posenc.jobs import finetune

    t = Tokenizer(models.WordLevel({"[UNK]": 0, "a": 1, "b": 2, "<": 3, "s": 4, ">": 5}, unk_token="[UNK]"))
    t.pre_tokenizer = pre_tokenizers.Whitespace()
    tok = PreTrainedTokenizerFast(tokenizer_object=t, unk_token="[UNK]", bos_token="<s>", eos_token="</s>")
    assert tok("a <s> b", add_special_tokens=False)["input_ids"] == [1, tok.bos_token_id, 2]  # what it did
    ids = extend.text_ids(tok, "a <s> b </s>")
    assert ids[:5] == [1, 3, 4, 5, 2] and not {tok.bos_token_id, tok.eos_token_id} & set(ids)
    (tmp_path / "c.txt").write_text("a <s> b\n" * 50)
    cfg = finetune.FinetuneConfig(name="x", corpus=str(tmp_path / "c.txt"), length=8)
    stream = finetune.train_stream(cfg, tok)
    assert tok.bos_token_id not in stream.tolist() and stream.tolist().count(tok.eos_token_id) == 1  # one document


def test_extend_refuses_a_store_of_an_older_or_a_newer_schema_in_one_line(llama_dir, capsys):
    """Records written before the row label was renamed (version 1: ``method``; nothing was released before, so no
    shim reads them) and a record of a newer posenc are each refused with one line, the file left as it was."""
    out = llama_dir / "o"
    argv = [
        "extend",
        "--model",
        str(llama_dir / "tiny"),
        "--corpus",
        str(llama_dir / "corpus.txt"),
        "--out",
        str(out),
        "--schedules",
        "none",
        "--lengths",
        "16",
        "--max-windows",
        "1",
        "--passkey-lengths",
    ]
    assert main(argv) == 0
    (new,) = [json.loads(x) for x in _lines(out)]
    old = {("method" if k == "adaptation" else k): v for k, v in new.items() if k != "schema_version"}
    (out / "records.jsonl").write_text(json.dumps(old) + "\n")
    capsys.readouterr()
    assert main(argv) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after the model's loading bar
    assert last == f"posenc: error: {out / 'records.jsonl'} line 1: not a ppl record (adaptation: Field required)"
    assert _lines(out) == [json.dumps(old)]
    (out / "records.jsonl").write_text(json.dumps({**new, "schema_version": SCHEMA_VERSION + 1}) + "\n")
    capsys.readouterr()
    assert main(argv) == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after the model's loading bar
    assert last == (
        f"posenc: error: {out / 'records.jsonl'} line 1 holds records of schema version {SCHEMA_VERSION + 1}; "
        f"this posenc reads versions up to {SCHEMA_VERSION} (a newer posenc wrote it)"
    )


def test_extend_refuses_lengths_no_schedule_would_score(llama_dir, capsys):
    """Lengths above factor x L0 are scored only by --long-schedules: with none of them in --schedules the table was
    empty."""
    out = llama_dir / "o"
    argv = [
        "extend",
        "--model",
        str(llama_dir / "tiny"),
        "--corpus",
        str(llama_dir / "corpus.txt"),
        "--out",
        str(out),
        "--schedules",
        "none",
        "--factor",
        "1",
        "--lengths",
        "16",
        "300",
        "--long-schedules",
        "dynamic",
        "--passkey-lengths",
    ]
    assert main(argv) == 2 and not out.exists()
    last = capsys.readouterr().err.strip().splitlines()[-1]  # after the model's loading bar
    assert (
        last.startswith("posenc: error: --lengths 300 exceed factor x native length = 256")
        and "--long-schedules (dynamic)" in last
    )


def test_finetune_without_peft_names_finetune_and_peft(llama_dir, capsys, monkeypatch):
    import sys

    monkeypatch.setitem(sys.modules, "peft", None)  # import peft raises ImportError
    argv = [
        "finetune",
        "--model",
        str(llama_dir / "tiny"),
        "--corpus",
        str(llama_dir / "corpus.txt"),
        "--length",
        "32",
        "--steps",
        "1",
        "--eval-lengths",
        "16",
        "--out",
        str(llama_dir / "f"),
    ]
    assert main(argv) == 2 and not (llama_dir / "f").exists()
    err = capsys.readouterr().err
    assert (
        err
        == "posenc: error: posenc finetune needs peft: pip install 'posenc[pretrained]' (or --lora-rank 0: no peft)\n"
    )


def test_extend_header_states_the_windows_each_point_scores(llama_dir):
    """--max-windows 1 scores one window per point: the header says so (it said "first 32768 tokens each")."""
    out = llama_dir / "h"
    argv = [
        "extend",
        "--model",
        str(llama_dir / "tiny"),
        "--corpus",
        str(llama_dir / "corpus.txt"),
        "--out",
        str(out),
        "--schedules",
        "none",
        "--lengths",
        "16",
        "32",
        "--max-windows",
        "1",
    ]
    assert main(argv) == 0
    text = (out / "results.md").read_text()
    assert "each point scores 1 window(s) of its length, the first in document order" in text
    assert main([*argv[:-1], "2"]) == 0  # a rerun with 2 windows: every point now holds 2
    assert "each point scores 2 window(s)" in (out / "results.md").read_text()
