import os
import struct
import subprocess
import sys
import textwrap

import pytest
import torch

from experiments.accumulated.claims import ACCUMULATED
from posenc.encodings.registry import IMPORT_VAR
from posenc.reports import claims

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True)
def _no_claim_sets(monkeypatch):
    """Each test starts with no claim set registered (``posenc.reports.claims``), whatever modules were imported."""
    monkeypatch.setattr(claims, "_SETS", {})


@pytest.fixture(autouse=True)
def _import_var():
    """POSENC_IMPORT as each test found it: ``import_schemes`` (a plugin's test) adds to it, and every later
    subprocess (the benchmarks' tests, compare's jobs) would import that plugin too."""
    before = os.environ.get(IMPORT_VAR)
    yield
    if before is None:
        os.environ.pop(IMPORT_VAR, None)
    else:
        os.environ[IMPORT_VAR] = before


@pytest.fixture
def accumulated_claims():
    """The claims of experiments/accumulated (arXiv 2606.24975, R1-R8) registered for one test."""
    return claims.register_claims(ACCUMULATED)


@pytest.fixture
def tiny_corpus(tmp_path, monkeypatch):
    """A private cache and a 10-document synthetic text corpus directory (for fast training tests)."""
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path / "cache"))
    d = tmp_path / "corpus"
    d.mkdir()
    for i in range(10):
        d.joinpath(f"doc{i}.txt").write_text(" ".join(f"word{(i * 7 + j * j) % 53}" for j in range(600)))
    return d


@pytest.fixture(scope="session")
def word_tokenizer():
    """A word-level Hugging Face tokenizer of the passkey texts (digits one token each)."""
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from posenc.eval import passkey

    words = passkey.TASK + " " + passkey.FILLER + passkey.QUESTION + " Remember it. is pass key"
    vocab = {"[UNK]": 0, **{c: i + 1 for i, c in enumerate("0123456789")}}
    for wd in words.replace(".", " . ").replace("?", " ? ").split():
        vocab.setdefault(wd, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True)]
    )
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", model_max_length=64)


def hf_full_and_decoded(model, ids, prefix: int):
    """Logits (B, T, V) of a Hugging Face causal LM on ``ids`` (B, T): the full forward, and a prefill of
    ``prefix`` tokens then one token at a time through the model's own KV cache."""
    with torch.no_grad():
        full = model(ids).logits
        out = model(ids[:, :prefix], use_cache=True)
        steps, cache = [out.logits], out.past_key_values
        for t in range(prefix, ids.shape[1]):
            out = model(ids[:, t : t + 1], cache=cache, use_cache=True)
            steps.append(out.logits)
            cache = out.past_key_values
    return full, torch.cat(steps, dim=1)


@pytest.fixture(scope="session")
def hf_decode():
    """:func:`hf_full_and_decoded`, for tests of Hugging Face models with a posenc scheme."""
    return hf_full_and_decoded


@pytest.fixture
def llama_dir(tmp_path, word_tokenizer):
    """A saved 2-layer Llama (4 heads, 2 KV heads, head dim 16, native context 256) with the word
    tokenizer, and a text corpus file, in tmp_path."""
    transformers = pytest.importorskip("transformers")
    from posenc.eval import passkey

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=len(word_tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rope_parameters={"rope_type": "default", "rope_theta": 1e4},
    )
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path / "tiny")
    word_tokenizer.save_pretrained(tmp_path / "tiny")
    (tmp_path / "corpus.txt").write_text((passkey.TASK + " " + passkey.FILLER + "\n") * 60)
    return tmp_path


def _wandb_records(run_dir):
    """The records of the one offline W&B run under ``run_dir``: its .wandb file (W&B's LevelDB-style log:
    a 7-byte file header, then 32 KiB blocks of chunks with a 7-byte header: CRC, length, type) parsed
    with wandb's own protobuf Record (its Python package ships no reader of these files: that went into wandb-core)."""
    from wandb.proto import wandb_internal_pb2 as pb

    (path,) = run_dir.glob("wandb/offline-run-*/run-*.wandb")
    raw, pos, chunk, out = path.read_bytes(), 7, b"", []
    assert raw[:4] == b":W&B"
    while pos + 7 <= len(raw):
        if 32768 - pos % 32768 < 7:  # a block's tail too short for a header is padding
            pos += 32768 - pos % 32768
            continue
        _, n, kind = struct.unpack("<IHB", raw[pos : pos + 7])
        chunk, pos = chunk + raw[pos + 7 : pos + 7 + n], pos + 7 + n
        if kind in (1, 4):  # FULL or LAST: a whole record
            out.append(pb.Record.FromString(chunk))
            chunk = b""
    return out


@pytest.fixture(scope="session")
def wandb_records():
    """:func:`_wandb_records`, for tests of W&B tracking."""
    return _wandb_records


HOLDER = textwrap.dedent(
    """
    import sys
    from posenc.store.lock import hold_run_dir, holding
    with holding():
        hold_run_dir(sys.argv[1])
        print("held", flush=True)
        sys.stdin.read()  # until the test closes it (or kills this process)
    """
)


@pytest.fixture
def holder():
    """Start another process that holds a directory's lock as a posenc command does; yields start(path) -> process
    (its pid in the lock file). Each is ended after the test."""
    procs = []

    def start(path):
        path.mkdir(parents=True, exist_ok=True)
        proc = subprocess.Popen(
            [sys.executable, "-c", HOLDER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        procs.append(proc)
        assert proc.stdout.readline() == "held\n"
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.stdin.close()
            proc.wait(timeout=30)
