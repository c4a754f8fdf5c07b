"""Typed run records and the one store that writes and reads them.

Every measurement a command keeps is one record of a kind below, one JSON line in a run's file:

- ``results.jsonl`` of ``posenc compare`` (and ``eval.jsonl`` of ``posenc eval``): :class:`Ppl` (perplexity at
  one evaluation length), :class:`PasskeyCell` (passkey accuracy of one length and depth), :class:`FarMass`
  (far attention mass and entropy at one length), :class:`Task` (a synthetic-task job: its :class:`TaskCell` s);
- ``records.jsonl`` of ``posenc extend`` and ``posenc finetune``: :class:`ScoredWindow` (one scored window of a
  pretrained model) and :class:`PasskeyTrial` (one passkey trial);
- ``diagnose.jsonl`` of ``posenc diagnose``: one :class:`Diagnosis` (its :class:`LengthDiagnosis` per length and
  :class:`LayerGap` per layer with phases), rewritten whole by each run (``write``).

A file's kind field picks the type within its family (``RUN``, ``PRETRAINED`` or ``DIAGNOSE``; no kind: ``ppl``,
as early ``eval.jsonl`` lines). Each record carries ``schema_version``; a line without one is version 1 (what posenc
wrote before the field); version 2 renamed the row label of ``ScoredWindow`` and ``PasskeyTrial`` from ``method`` to
``adaptation`` (before a first release, an older line is not read under the new names: ``load`` refuses it with one
line naming the field). ``append`` writes
one record as one line, ``write`` replaces a file by its records; ``load`` reads a file back, ignoring a last line
cut short by an interrupted append (one-line warning), and refuses any other line that is not JSON, a record of a
newer version or of an unknown kind with one line naming the file and line. :class:`RunStore` is a compare run's
records file as one command reads and appends it: read once, then only what was appended.
``load_ppl`` reads a compare directory's perplexity records from its ``results.jsonl``, else from the
``results.csv`` committed results keep (a torn last row warned of and ignored, any other bad row refused, as in the
JSONL); ``load_tasks`` a task comparison's :class:`Task` records from its
``results.jsonl``, else from its ``retrieval.csv``.
"""

from __future__ import annotations

import csv
import io
import math
import sys
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from posenc.errors import PosencError
from posenc.store.checkpoint import append_jsonl, atomic_write_bytes, decode_record, is_json, jsonl_bytes, write_jsonl

SCHEMA_VERSION = 2  # raise it when a record's fields change name or meaning; load refuses a newer file


# what a measured number can be: finite (a NaN or inf in a record is damage, not a measurement)
Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegative = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class Record(BaseModel):
    """Fields every record has: its kind and the schema version it was written with."""

    model_config = ConfigDict(extra="forbid")

    kind: str
    schema_version: int = SCHEMA_VERSION


class Ppl(Record):
    """Perplexity of one model at one evaluation length (``posenc.eval.perplexity.evaluate_length`` measures it).
    ``ratio`` is derived (ppl over the same scheme and seed's ppl at the training length,
    ``posenc.reports.text.with_ratios``): in results.csv, never in the JSONL."""

    kind: Literal["ppl"] = "ppl"
    scheme: str
    seed: int | None = None  # posenc eval: the run's own
    train_length: int
    eval_length: int
    method: str | None = None  # an inference method's full spec (posenc.methods), e.g. self-extend:group=4,window=64
    corpus: str | None = None  # posenc eval: the corpus scored (compare: the preset's, in preset.json)
    windows: int | None = None
    scored_tokens: int | None = None
    nll: NonNegative | None = None  # summed over the scored tokens, nats
    ppl: Positive | None = None  # None: not measurable (``note``)
    bucket_edges: list[int] | None = None  # position-bucket edges in the window (tokens)
    bucket_ppl: list[float] | None = None
    note: str | None = None
    seconds: float | None = None
    ratio: float | None = None

    @model_validator(mode="after")
    def _ppl_of_its_nll(self) -> Ppl:  # an edited number would be reported as measured
        if None not in (self.nll, self.ppl, self.scored_tokens) and self.scored_tokens > 0:
            if not math.isclose(self.ppl, math.exp(self.nll / self.scored_tokens), rel_tol=1e-9):
                raise ValueError(
                    f"ppl {self.ppl} is not exp(nll / scored_tokens) = {math.exp(self.nll / self.scored_tokens)}"
                )
        return self


class PasskeyCell(Record):
    """Passkey retrieval of one posenc model at one (length, depth): ``correct`` of ``trials``
    (``posenc.eval.passkey``)."""

    kind: Literal["passkey"] = "passkey"
    scheme: str
    method: str | None = None  # as Ppl.method
    seed: int | None = None
    train_length: int | None = None
    length: int  # prompt tokens
    depth: float  # key position as a fraction of the filler
    mode: str = "rank"
    candidates: int | None = None
    digits: int | None = None
    trials: int
    correct: int
    accuracy: float | None = None  # None: not measurable (``note``)
    seconds: float | None = None
    note: str | None = None

    @model_validator(mode="after")
    def _accuracy_of_its_counts(self) -> PasskeyCell:
        if not 0 <= self.correct <= self.trials:
            raise ValueError(f"correct {self.correct} is not in [0, trials = {self.trials}]")
        if self.accuracy is not None and not (
            self.trials and math.isclose(self.accuracy, self.correct / self.trials, rel_tol=1e-9)
        ):
            raise ValueError(f"accuracy {self.accuracy} is not correct / trials = {self.correct}/{self.trials}")
        return self


class FarMass(Record):
    """Mean softmax mass on keys at distance >= ``w`` and mean attention entropy (nats) at one length, over layers
    and heads (``posenc.eval.diagnose.far_mass_records``); ``uniform_*`` are uniform causal attention's."""

    kind: Literal["far_mass"] = "far_mass"
    scheme: str
    seed: int | None = None
    train_length: int | None = None
    length: int
    windows: int | None = None
    far_mass_mean: float | None = None
    entropy_mean: float | None = None
    uniform_far_mass: float | None = None
    uniform_entropy: float | None = None
    w: int | None = None  # None: a "not supported" record
    note: str | None = None


class TaskCell(BaseModel):
    """Answers of one (test, sequence length, evidence-distance bucket) of a task job (``posenc.eval.tasks``)."""

    model_config = ConfigDict(extra="forbid")

    test: str
    length: int
    bucket: int
    n: int  # answers
    correct: int
    nll: float  # summed over the answers, nats


class Task(Record):
    """One synthetic-task job (``posenc.jobs.job.TaskJob``): its cells, training and evaluation seconds, threads."""

    kind: Literal["task"] = "task"
    task: str
    scheme: str
    seed: int
    train_length: int
    train_seconds: float
    eval_seconds: float
    threads: int
    cells: list[TaskCell]
    trained_steps: int | None = None  # steps the model trained (below the cap when it met train.until)
    criterion: str | None = None  # train.until as words (UntilConfig.describe); None: trained to the cap
    criterion_step: int | None = None  # the step it met the criterion at; None: not met (or no criterion)
    n_head: int | None = None  # the model's query heads (ALiBi's slopes follow from them); None: not recorded
    loss_curve: list[tuple[int, float]] | None = None  # (step, training loss) of each logged step (train.jsonl)
    # mean -log f per token (nats) of each head of each forget-gate layer over the controlled-gap probe's gap
    # (posenc.eval.tasks.gate_leak), (gated layers, heads); None: no forget gate, or not recorded
    leak: list[list[float]] | None = None
    # the spec the job trained: its scheme, or a sweep variant of it (``posenc.config.plan.job_encoding``, e.g.
    # forget:init_bias=4); None: unknown (not recorded)
    encoding: str | None = None
    # True: a sweep's screening of a grid point, the tests at the training length only (what the chooser reads); the
    # job's full record, if the point is chosen, follows it (``posenc.jobs.job.TaskJob``)
    screening: bool = False


class ScoredWindow(Record):
    """One scored window of a pretrained model (``posenc extend`` / ``finetune``): NLL sum over its scored targets
    and per position bucket. ``key`` is its resume key, ``adaptation`` the row label of what was applied to the model
    (a RoPE schedule name, ``scheme:SPEC`` for a posenc scheme swapped in, either with ``, fine-tuned N steps``),
    ``setting`` the tag of the run's setting."""

    kind: Literal["ppl"] = "ppl"
    key: str
    adaptation: str
    factor: float
    length: int
    stride: int
    bos: str
    doc: str
    begin: int
    bucket: int
    signature: str
    seconds: float
    nll_sum: float
    n_scored: int
    bucket_nll: list[float]
    bucket_n: list[int]
    reused_from: str | None = None  # the adaptation whose equal forward was reused
    setting: str | None = None


def trial_key(adaptation: str, length: int, depth: float, trial: int) -> str:
    """The resume key of one passkey trial (the format of every version: old stores' keys still match)."""
    return f"passkey|{adaptation}|{length}|{depth}|{trial}"


class PasskeyTrial(Record):
    """One greedy passkey trial of a pretrained model (``posenc.eval.passkey.passkey_trial``); ``adaptation`` as
    :class:`ScoredWindow`'s."""

    kind: Literal["passkey"] = "passkey"
    key: str
    adaptation: str
    factor: float
    length: int
    depth: float
    trial: int
    seconds: float | None = None
    passkey: int  # the number hidden in the prompt
    answer: str | None = None
    got: int | None = None
    correct: bool
    prompt_tokens: int
    setting: str | None = None
    bos: Literal["none", "prepend"] = "none"  # the prompt's BOS policy; before passkey prompts took it, none had a BOS


class LengthDiagnosis(BaseModel):
    """Attention of a posenc model at one evaluation length (``posenc.eval.diagnose.diagnose_model``): far mass (keys at
    distance >= w), its Sec. 4 lower bound and entropy (nats) per layer and head, (n_layer, n_head) lists (far mass
    None when no query has far keys; all None with a ``note`` when the scheme cannot run the length), their means
    over layers and heads, and uniform causal attention's."""

    model_config = ConfigDict(extra="forbid")

    length: int  # tokens
    multiple: float  # length / training length
    windows: int  # held-out windows measured
    far_mass: list[list[float]] | None = None
    far_mass_bound: list[list[float]] | None = None
    entropy: list[list[float]] | None = None
    far_mass_mean: float | None = None
    entropy_mean: float | None = None
    uniform_far_mass: float | None = None
    uniform_entropy: float | None = None
    note: str | None = None


class LayerGap(BaseModel):
    """Spectral gap of one layer's step angles (``posenc.eval.diagnose``): beta = |mean exp(i theta)| (H, D/2) over
    ``steps`` steps, the scheme's step-law baseline (D/2,) (None without one) and the mean step
    arg mean exp(i theta) (H, D/2) in rad/token."""

    model_config = ConfigDict(extra="forbid")

    layer: int
    steps: int
    beta: list[list[float]]
    baseline: list[float] | None = None
    mean_step: list[list[float]]


class Diagnosis(Record):
    """One ``posenc diagnose`` of a trained model: its settings (far keys at distance >= ``w`` tokens), a
    :class:`LengthDiagnosis` per length, a :class:`LayerGap` per layer with phases (None when no layer has any) and
    ``note`` when the scheme is not supported (no lengths then)."""

    kind: Literal["diagnosis"] = "diagnosis"
    scheme: str
    describe: str
    train_length: int
    w: int
    windows_per_length: int
    lengths: list[LengthDiagnosis] = []
    spectral_gap: list[LayerGap] | None = None
    note: str | None = None


PretrainedRecord = ScoredWindow | PasskeyTrial
RUN: dict[str, type[Record]] = {"ppl": Ppl, "passkey": PasskeyCell, "far_mass": FarMass, "task": Task}
PRETRAINED: dict[str, type[Record]] = {"ppl": ScoredWindow, "passkey": PasskeyTrial}
DIAGNOSE: dict[str, type[Record]] = {"diagnosis": Diagnosis}


def _row(record: Record) -> dict:
    """The JSON line of ``record`` (a Ppl's derived ratio left out, and its corpus when unset)."""
    if not isinstance(record, Ppl):
        return record.model_dump(mode="json")
    return record.model_dump(mode="json", exclude={"ratio"} if record.corpus else {"ratio", "corpus"})


def append(path: Path, record: Record) -> None:
    """Append ``record`` as one line, written and flushed at once (``posenc.store.checkpoint.append_jsonl``)."""
    append_jsonl(path, _row(record))


def write(path: Path, records: list[Record]) -> None:
    """Replace ``path`` by ``records``, one line each, in one atomic write (a file a command rewrites whole)."""
    write_jsonl(path, [_row(r) for r in records])


def _parse(raw: dict, kinds: dict[str, type[Record]], where: str) -> Record:
    """The typed record of one decoded line. Raises PosencError naming ``where`` for a newer schema version, an
    unknown kind or fields that do not fit the kind."""
    version = raw.get("schema_version", 1)
    if not isinstance(version, int) or version > SCHEMA_VERSION:
        raise PosencError(
            f"{where} holds records of schema version {version}; this posenc reads versions up to "
            f"{SCHEMA_VERSION} (a newer posenc wrote it)"
        )
    raw = {**raw, "schema_version": version}  # a line without the field is version 1, not this posenc's
    kind = raw.get("kind", "ppl")
    if kind not in kinds:
        raise PosencError(f"{where} holds a record of unknown kind {kind!r}; known: {', '.join(kinds)}")
    try:
        return kinds[kind].model_validate(raw)
    except ValidationError as exc:
        err = exc.errors()[0]
        field = ".".join(map(str, err["loc"]))  # none for a check across fields (its message names them)
        msg = err["msg"].removeprefix("Value error, ")
        raise PosencError(f"{where}: not a {kind} record ({f'{field}: ' if field else ''}{msg})") from None


def _lines(data: bytes, path: Path, first: int, kinds: dict[str, type[Record]]) -> tuple[list[Record], int]:
    """The records of the whole lines of ``data`` (``path``'s bytes from its line ``first`` on) and how many bytes
    they take: a last line without its newline is left out (an append cut short, or one still being written).
    PosencError (one line naming the file and line) for a whole line that is not JSON or not a record."""
    end = data.rfind(b"\n") + 1
    out = []
    for i, line in enumerate(data[:end].splitlines(), first):
        if not line.strip():  # a blank line holds no record
            continue
        out.append(_parse(decode_record(line, f"{path} line {i}"), kinds, f"{path} line {i}"))
    return out, end


def _torn(data: bytes, path: Path, line: int) -> bool:
    """Whether ``data`` ends in a line cut short (no newline, not JSON): an interrupted append, said in a one-line
    warning on stderr. A last line that is whole JSON without its newline is a record (a file written by hand)."""
    tail = data[data.rfind(b"\n") + 1 :]
    if not tail.strip() or is_json(tail):
        return False
    if (path, len(data)) not in _WARNED:  # once per file as it is: a report reads a run's records more than once
        _WARNED.add((path, len(data)))
        print(f"posenc: warning: {path} line {line} is cut short (an interrupted append); ignored", file=sys.stderr)
    return True


_WARNED: set[tuple[Path, int]] = set()  # (file, its size) whose torn last line this process warned of


def load(path: Path, kinds: dict[str, type[Record]] = RUN) -> list[Record]:
    """Typed records of a JSONL file, of the family ``kinds`` ([] when it does not exist). A last line cut short
    (an interrupted append) is ignored with a one-line warning on stderr. Raises PosencError (one line, naming the
    file and line) for any other line that is not JSON, a record of a newer schema version, of an unknown kind, or
    whose fields do not fit its kind."""
    path = Path(path)
    data = jsonl_bytes(path)
    if not data:
        return []
    last = data.count(b"\n") + 1  # the number of a line after the last newline
    return _lines(data if _torn(data, path, last) else data + b"\n", path, 1, kinds)[0]


class RunStore:
    """The one reader and appender of a run's records file (``results.jsonl``) in a command: the file is read once.

    Opening reads it, a last line cut short by an interrupted append cut off (one-line warning on stderr) so the next
    append starts a clean line; ``append`` adds a record as one line; ``refresh`` reads only what was appended since
    the last read (by this process or by jobs in others: a job process gets a pickled copy and appends to the same
    file), so each byte is read once per invocation. ``records``: every record read so far, in file order. Raises
    PosencError as :func:`load` does."""

    def __init__(self, path: Path, kinds: dict[str, type[Record]] = RUN):
        self.path, self.kinds = Path(path), kinds
        self.records: list[Record] = []
        self._end, self._line = 0, 1  # bytes read, and the number of the next line
        data = jsonl_bytes(self.path)
        if data:
            if not data.endswith(b"\n"):
                line = data.count(b"\n") + 1
                print(
                    f"posenc: warning: {self.path} line {line} is cut short (an interrupted append); removed",
                    file=sys.stderr,
                )
                data = data[: data.rfind(b"\n") + 1]
                atomic_write_bytes(self.path, data)
            self._take(data)

    def _take(self, data: bytes) -> None:
        new, end = _lines(data, self.path, self._line, self.kinds)
        self.records += new
        self._end += end
        self._line += data[:end].count(b"\n")

    def refresh(self) -> list[Record]:
        """Read the lines appended since the last read; returns their records (also added to ``records``)."""
        if not self.path.exists():
            return []
        with open(self.path, "rb") as f:
            f.seek(self._end)
            data = f.read()
        before = len(self.records)
        self._take(data)
        return self.records[before:]

    def append(self, record: Record) -> None:
        """Append ``record`` as one line (``append``); ``refresh`` reads it back into ``records``."""
        append(self.path, record)


def full_records(records: list[Record]) -> list[Record]:
    """``records`` without the screening records (``Task.screening``) of jobs that also have a full one."""
    full = {(r.task, r.scheme, r.seed) for r in records if isinstance(r, Task) and not r.screening}
    return [r for r in records if not (isinstance(r, Task) and r.screening and (r.task, r.scheme, r.seed) in full)]


_INT, _FLOAT = ("seed", "train_length", "eval_length", "windows", "scored_tokens"), ("nll", "ppl", "ratio")


def load_csv(path: Path) -> list[Ppl]:
    """The perplexity records of a compare ``results.csv`` (``posenc.reports.text.write_csv``): numbers parsed, empty
    cells None, rows without lengths dropped. A last row cut short (no line end, and a wrong field count or a number
    that does not parse: an interrupted write) is ignored with a one-line warning on stderr, as :func:`load` does.
    Raises PosencError naming the file for another table, and naming the file and line for any other row with a
    wrong field count or a number that does not parse (never a number read from a torn row)."""
    if Path(path).is_dir():
        raise PosencError(f"{path} is damaged (a directory, not a CSV file)")
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise PosencError(f"{path} is damaged (not UTF-8 text: {exc})") from None
    reader = csv.reader(io.StringIO(text))
    header = next(reader, [])
    missing = [k for k in ("scheme", "train_length", "eval_length") if k not in header]
    if missing:
        raise PosencError(f"{path} is not a posenc results table (no {missing[0]} column)")
    out = []
    for cells in reader:
        line = reader.line_num
        if not cells:  # a blank line holds no row
            continue
        try:
            if len(cells) != len(header):
                raise ValueError(f"{len(cells)} fields, the header has {len(header)}")
            row = dict(zip(header, cells))
            rec = {
                k: None if row.get(k) in (None, "") else (int(row[k]) if k in _INT else float(row[k]))
                for k in _INT + _FLOAT
            }
        except ValueError as exc:
            if text.endswith(("\n", "\r")) or line != text.count("\n") + 1:
                raise PosencError(
                    f"{path} line {line} is not a results row ({exc}); repair or remove that line"
                ) from None
            if (Path(path), len(text)) not in _WARNED:  # once per file as it is, as a torn JSONL line
                _WARNED.add((Path(path), len(text)))
                print(
                    f"posenc: warning: {path} line {line} is cut short (an interrupted write); ignored", file=sys.stderr
                )
            continue
        if rec["eval_length"] and rec["train_length"]:
            try:
                out.append(Ppl(scheme=row["scheme"], note=row.get("note") or None, **rec))
            except ValidationError as exc:  # a number out of its range (a negative or NaN perplexity)
                err = exc.errors()[0]
                raise PosencError(f"{path} line {line}: not a results row ({err['loc'][0]}: {err['msg']})") from None
    return out


def load_ppl(run_dir: Path) -> list[Ppl] | None:
    """The perplexity records of a compare run directory: its ``results.jsonl``, else its ``results.csv``
    (committed results keep only the CSV); None when it has neither. PosencError for a results.jsonl holding one
    cell twice (a job appends each length once and skips it on a rerun: a second record is an edit, which the report
    would take for another seed)."""
    run_dir = Path(run_dir)
    if (run_dir / "results.jsonl").exists():
        return _once([r for r in load(run_dir / "results.jsonl") if isinstance(r, Ppl)], run_dir / "results.jsonl")
    if (run_dir / "results.csv").exists():
        return load_csv(run_dir / "results.csv")
    return None


def _once(records: list[Ppl], path: Path) -> list[Ppl]:
    seen: set = set()
    for r in records:
        if r.eval_length % r.train_length:  # compare scores multiples of the training length only
            raise PosencError(
                f"{path} has a perplexity record of {r.scheme} seed {r.seed} at length {r.eval_length}, not a multiple "
                f"of its training length {r.train_length}: the record is damaged"
            )
        key = (r.scheme, r.seed, r.method, r.corpus, r.eval_length)
        if key in seen:
            raise PosencError(
                f"{path} holds two perplexity records of {r.scheme} seed {r.seed} at length {r.eval_length}"
                f"{' (' + r.method + ')' if r.method else ''}: remove one"
            )
        seen.add(key)
    return records


def _task_train_length(cells: list[TaskCell], where: str) -> int:
    """The training length of a job from a retrieval.csv written before its train_length column: the shortest length
    of its ``id`` test (the in-distribution test at 1x, which every task's tests include at the preset's multiples)."""
    lengths = [c.length for c in cells if c.test == "id"]
    if not lengths:
        raise PosencError(f"{where}: no train_length column and no id cells that give it")
    return min(lengths)


def load_task_csv(path: Path) -> list[Task]:
    """The task records of a task comparison's ``retrieval.csv`` (``posenc.reports.tasks.write_csv``): one per
    (task, scheme, seed), its cells (nll = nll_mean x answers, rounded as the CSV is), train_length, trained_steps
    criterion_step and encoding from their columns (a CSV written before them: train_length from the id cells, the
    others None); times NaN and threads 0 (the CSV keeps none). Raises PosencError naming the file for another table."""
    groups: dict[tuple[str, str, int], list[dict]] = {}
    rows = csv.DictReader(io.StringIO(Path(path).read_text(encoding="utf-8")))
    try:
        for row in rows:
            groups.setdefault((row["task"], row["scheme"], int(row["seed"])), []).append(row)
        out = []
        for (task, scheme, seed), job in groups.items():
            cells = [
                TaskCell(
                    test=r["test"],
                    length=int(r["length"]),
                    bucket=int(r["bucket"]),
                    n=int(r["answers"]),
                    correct=int(r["correct"]),
                    nll=float(r["nll_mean"]) * int(r["answers"]),
                )
                for r in job
            ]
            extra = {
                k: int(job[0][k]) if job[0].get(k) else None
                for k in ("train_length", "trained_steps", "criterion_step")
            }
            extra["encoding"] = job[0].get("encoding") or None
            L0 = extra.pop("train_length") or _task_train_length(cells, f"{path} ({task}, {scheme}, seed {seed})")
            out.append(
                Task(
                    task=task,
                    scheme=scheme,
                    seed=seed,
                    train_length=L0,
                    train_seconds=float("nan"),
                    eval_seconds=float("nan"),
                    threads=0,
                    cells=cells,
                    **extra,
                )
            )
    except (KeyError, ValueError, TypeError) as exc:
        raise PosencError(f"{path} is not a posenc retrieval table ({type(exc).__name__}: {exc})") from None
    return out


def load_tasks(run_dir: Path) -> list[Task] | None:
    """The task records of a task comparison directory: its ``results.jsonl``, else its ``retrieval.csv`` (committed
    results keep the CSV); None when it has neither."""
    run_dir = Path(run_dir)
    if (run_dir / "results.jsonl").exists():
        return [r for r in load(run_dir / "results.jsonl") if isinstance(r, Task)]
    if (run_dir / "retrieval.csv").exists():
        return load_task_csv(run_dir / "retrieval.csv")
    return None
