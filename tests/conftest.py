import os

import pytest
import torch

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


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
    from posenc import passkey
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = (passkey.TASK + " " + passkey.FILLER + passkey.QUESTION + " Remember it. is pass key")
    vocab = {"[UNK]": 0, **{c: i + 1 for i, c in enumerate("0123456789")}}
    for wd in words.replace(".", " . ").replace("?", " ? ").split():
        vocab.setdefault(wd, len(vocab))
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Whitespace(), pre_tokenizers.Digits(individual_digits=True)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", model_max_length=64)
