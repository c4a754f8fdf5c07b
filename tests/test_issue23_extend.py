"""Issue 23 on the pretrained-model commands: reruns count each passkey trial once, and their one-line notices."""

from __future__ import annotations

import json

import pytest
import torch

transformers = pytest.importorskip("transformers")

from posenc import extend, passkey  # noqa: E402
from posenc.cli import main  # noqa: E402


@pytest.fixture
def llama_dir(tmp_path, word_tokenizer):
    """A saved 2-layer Llama (native context 256) with the word tokenizer, and a text corpus file."""
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=len(word_tokenizer), hidden_size=64, intermediate_size=128,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=256, rope_parameters={"rope_type": "default", "rope_theta": 1e4})
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path / "tiny")
    word_tokenizer.save_pretrained(tmp_path / "tiny")
    (tmp_path / "corpus.txt").write_text((passkey.TASK + " " + passkey.FILLER + "\n") * 60)
    return tmp_path


def _lines(out):
    return (out / "records.jsonl").read_text().splitlines()


def _passkey_cells(out):
    return (out / "passkey.csv").read_text()


def test_extend_rerun_counts_each_passkey_trial_once(llama_dir):
    out = llama_dir / "o"
    argv = ["extend", "--model", str(llama_dir / "tiny"), "--corpus", str(llama_dir / "corpus.txt"), "--out", str(out),
            "--methods", "none", "yarn", "--lengths", "16", "--max-windows", "1", "--passkey-lengths", "120",
            "--trials", "2", "--scheme", "alibi"]
    assert main(argv) == 0
    lines, cells = _lines(out), _passkey_cells(out)
    trials = [json.loads(x) for x in lines if json.loads(x)["kind"] == "passkey"]
    assert len(trials) == 3 * 2 and all(isinstance(r["key"], str) and 10000 <= r["passkey"] <= 99999 for r in trials)
    assert main(argv) == 0  # a rerun: nothing recomputed, every count unchanged
    assert _lines(out) == lines and _passkey_cells(out) == cells
    assert ",2," in cells.splitlines()[1]  # 2 trials per cell, not 4


def test_finetune_rerun_counts_each_passkey_trial_once(llama_dir):
    pytest.importorskip("peft")
    out = llama_dir / "f"
    argv = ["finetune", "--model", str(llama_dir / "tiny"), "--corpus", str(llama_dir / "corpus.txt"), "--length", "32",
            "--steps", "2", "--eval-lengths", "16", "--eval-windows", "1", "--passkey-lengths", "120", "--trials", "2",
            "--scheme", "alibi", "--out", str(out)]
    assert main(argv) == 0
    lines, cells = _lines(out), _passkey_cells(out)
    assert sum(json.loads(x)["kind"] == "passkey" for x in lines) == 2 * 2  # before and after training
    assert main(argv) == 0
    assert _lines(out) == lines and _passkey_cells(out) == cells


def test_records_of_the_old_passkey_field_resume_and_count_once(tmp_path):
    """Records of the earlier release: the passkey number had overwritten the resume key, and each rerun had
    appended the trial again. Their key is rebuilt and the repeat counts once."""
    old = {"kind": "passkey", "key": 12345, "method": "none", "factor": 2.0, "length": 120, "depth": 0.5, "trial": 0,
           "correct": True, "prompt_tokens": 100, "setting": "t"}
    path = tmp_path / "records.jsonl"
    path.write_text((json.dumps(old) + "\n") * 2)
    store = extend._Store(path, "t")
    assert [(r["key"], r["passkey"]) for r in store.records] == [("passkey|none|120|0.5|0", 12345)]
    assert extend._trial_key("none", 120, 0.5, 0) in store.done
