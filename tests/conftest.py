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
