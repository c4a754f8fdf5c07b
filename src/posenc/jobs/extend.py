"""Context extension of a pretrained RoPE model, measured: the job behind ``posenc extend``.

``extend(cfg)`` scores perplexity vs length and passkey retrieval for each RoPE schedule
(none, PI, NTK-aware, dynamic NTK, YaRN, Llama-3, ReRoPE, leaky ReRoPE: ``posenc.rope``)
on held-out text, then for each posenc scheme put into the model's attention
(``--scheme``, ``posenc.hf.scheme.apply_scheme``; no fine-tuning, so any scheme but ``rope``
shows the cost of the swap). Each window and passkey trial is one record appended to
``records.jsonl`` at once, so an interrupted run resumes where it stopped; the records
are summarised in ``results.md``, CSV files and plots (``posenc.reports.pretrained``)
under ``runs/extend/<name>/``.

The configuration is :class:`ExtendConfig`; presets are YAML files shipped as package
data (``posenc/presets/extend/NAME.yaml``, read with ``importlib.resources``, so an
installed wheel has them) or a path. Their keys are the command's flags; unknown keys
and bad values are one-line errors before any work.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from posenc import methods, rope
from posenc.config.plan import plain_name
from posenc.data.corpora import Document, load_corpus
from posenc.errors import PosencError
from posenc.eval import passkey, perplexity, progress
from posenc.hf import loading, long_context, schedules
from posenc.hf import scheme as hf
from posenc.hf.adaptation import SWITCHES, Adaptation
from posenc.reports import pretrained as report
from posenc.reports.render import plot_stream
from posenc.rope import NAMES, check_name
from posenc.scoring import Window
from posenc.store.checkpoint import check_run_dir, drop_torn_tail, read_json, write_json
from posenc.store.lock import hold_run_dir, open_run_dir
from posenc.store.presets import (
    MAX_COUNT,
    SHIPPED,
    Count,
    CountOrOff,
    Seed,
    Threads,
    distinct,
    load_flat,
    refuse_other_settings,
)
from posenc.store.presets import preset_names as shipped
from posenc.store.records import PRETRAINED, PasskeyTrial, ScoredWindow, append, load, trial_key
from posenc.store.stamp import WeightsDtype, resolve_dtype, run_stamp, stamp_line

PRESETS = SHIPPED / "extend"
# the setting: one per run directory (check_same_setting refuses a rerun of another); its records carry its tag
SETTING = (
    "model",
    "corpus",
    "docs",
    "factor",
    "max_tokens",
    "stride",
    "bos",
    "bucket",
    "rerope_window",
    "leak",
    "seed",
)
# in the setting (and its tag) only when given, so a setting that leaves them unset hashes as one that never had
# them: the records of results/extend-quick and results/smollm2-* keep their tag
OPTIONAL_SETTING = (
    "original_max_position_embeddings",
    "attention_factor",
    "beta_fast",
    "beta_slow",
    "truncate",
    "low_freq_factor",
    "high_freq_factor",
    "short_factor",
    "long_factor",
    "mscale",
    "mscale_all_dim",
)
# each schedule setting and the posenc.rope schedule parameter (Extension field) it gives
SCHEDULE_KEYS = {"rerope_window": "window", "leak": "leak", **{k: k for k in OPTIONAL_SETTING[1:]}}
# what one call ran, listed in config.json
INVOCATION = (
    "lengths",
    "long_schedules",
    "max_windows",
    "passkey_lengths",
    "passkey_depths",
    "passkey_schedules",
    "name",
    "schedules",
    "schemes",
    "methods",
    "stream",
)
SCHEME_LABEL = "scheme:"  # a posenc scheme's adaptation label: scheme:SPEC


class ScheduleSettings(BaseModel):
    """The RoPE schedule settings of a pretrained model, the keys and flags ``posenc extend`` and ``posenc finetune``
    share (``posenc.hf.schedules.Extension``: meaning, defaults and errors). Each but ``factor`` and
    ``original_max_position_embeddings`` (L0 for every schedule) sets the ``posenc.rope`` parameter
    ``SCHEDULE_KEYS`` names, of the run's schedules that take it (:func:`extension`); None: its default."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True, allow_inf_nan=False)

    factor: float = Field(2.0, ge=1)
    """Scale factor s."""
    original_max_position_embeddings: int | None = Field(None, ge=2)
    """L0 in tokens; None: the model's native context."""
    attention_factor: float | None = Field(None, gt=0)
    """Multiplies cos and sin (yarn, longrope); None: the schedule's."""
    beta_fast: float | None = None
    """YaRN: rotations per L0 above which frequencies are kept (default 32)."""
    beta_slow: float | None = None
    """YaRN: rotations per L0 below which they are divided by s (default 1)."""
    truncate: bool | None = None
    """YaRN: floor/ceil the ramp's ends (default true)."""
    low_freq_factor: float | None = None
    """Llama 3: wavelengths > L0 / low_freq_factor divided by s (default 1)."""
    high_freq_factor: float | None = None
    """Llama 3: wavelengths < L0 / high_freq_factor kept (default 4)."""
    short_factor: list[float] | None = None
    """LongRoPE: D/2 factors up to L0 (a model's searched list)."""
    long_factor: list[float] | None = None
    """LongRoPE: D/2 factors past L0."""
    mscale: float | None = Field(None, gt=0)
    """YaRN as DeepSeek: attention factor (0.1 mscale ln s + 1) / (0.1 mscale_all_dim ln s + 1), with mscale_all_dim."""
    mscale_all_dim: float | None = Field(None, gt=0)
    """YaRN as DeepSeek: the denominator's mscale (with mscale)."""
    rerope_window: int | None = None
    """ReRoPE window w; None: L0/4."""
    leak: float | None = None
    """Leaky ReRoPE k > 1; None: (s L0 - w)/(L0 - w)."""


class ScoringConfig(ScheduleSettings):
    """How a pretrained model is scored on held-out text (perplexity, passkey retrieval), and its schedule settings:
    the fields ``posenc extend`` and ``posenc finetune`` (``posenc.jobs.finetune.FinetuneConfig``) share; tokens of the
    model's tokenizer."""

    name: str = Field(min_length=1)
    """The run directory runs/<command>/<name> (the default output): a plain directory name (letters, digits,
    . _ -), never outside runs/<command>."""

    _plain_name = field_validator("name")(plain_name)
    model: str = loading.DEFAULT_MODEL
    """'smollm2', a .gguf file, a model directory or a hub id."""
    corpus: str = "shakespeare"
    """Corpus spec (posenc.data.corpora); its held-out documents are scored."""
    docs: list[str] = Field(["first"], min_length=1)
    """Held-out document names, 'all' or 'first'."""
    max_tokens: int = Field(32768, ge=2, le=MAX_COUNT)
    """The first max_tokens tokens of each document."""
    bos: Literal["none", "prepend"] = "none"
    """``none``: windows of raw text; ``prepend``: BOS + length - 1 text tokens."""
    passkey_lengths: list[Annotated[int, Field(ge=1)]] = []
    """Prompt lengths; empty: no passkey."""
    passkey_depths: list[Annotated[float, Field(ge=0, le=1)]] = [0.5]
    """Passkey needle depths, fractions of the prompt (0: start, 1: end)."""
    trials: Count = 1
    """Passkey trials per (length, depth) cell."""

    _distinct_scoring = field_validator("docs", "passkey_lengths", "passkey_depths")(distinct)


class ExtendConfig(ScoringConfig):
    """One ``posenc extend`` run; lengths, windows and strides in tokens of the model's tokenizer."""

    stride: int | None = None
    """Sliding-window stride in text tokens; None: non-overlapping windows."""
    bucket: int | None = Field(None, ge=1)
    """Position-bucket width (tokens); None: the run directory's (open_store), else 1/32 of each length
    (perplexity.bucket_width)."""
    seed: Seed = 0
    """Seed of the passkey keys, in [0, 2^31)."""
    schedules: list[str] = Field(list(NAMES), min_length=1)
    """RoPE context-extension schedules (posenc.rope)."""
    schemes: list[str] = []
    """Posenc schemes put into the model's attention after the schedules (posenc.hf.scheme.apply_scheme)."""
    methods: list[str] = []
    """Long-context methods (posenc.methods) on native RoPE, or SCHEDULE+METHOD on a fixed-frequency schedule."""
    stream: CountOrOff = 0
    """Targets of the held-out text (joined) streamed through each sinks method's bounded cache; 0: none."""
    lengths: list[Annotated[int, Field(ge=2)]] = Field(min_length=1)
    """Model positions per window."""
    long_schedules: list[str] | None = None
    """Only these at lengths > factor x L0; None: every schedule."""
    max_windows: CountOrOff = 0
    """Windows per (adaptation, length); 0: all."""
    passkey_schedules: list[str] | None = None
    """The schedules of the passkey trials; None: every schedule."""
    threads: Threads | None = None
    """Torch CPU threads; None: torch's choice."""
    dtype: WeightsDtype = "float32"
    """The weights' and compute's dtype (``posenc.store.stamp.resolve_dtype``; "auto": bfloat16 where the CPU has
    bf16 units); positions, angles and log-probabilities stay float32."""

    _distinct_lists = field_validator(
        "schedules", "schemes", "methods", "lengths", "long_schedules", "passkey_schedules"
    )(lambda v: v if v is None else distinct(v))


def preset_names() -> list[str]:
    """Names of the shipped extend presets (``posenc/presets/extend/*.yaml``)."""
    return shipped(PRESETS)


def load_extend_config(name_or_path: str, overrides: dict[str, Any] | None = None) -> ExtendConfig:
    """An extend preset by name (package data) or YAML path; ``overrides`` (given flags) replace its keys.

    Raises PosencError (one line) for an unknown preset, invalid YAML, an unknown key or
    bad value, an unknown schedule, a stride outside [1, shortest length - 1], or a given ``passkey_schedules``
    naming a schedule outside ``schedules``, or given without passkey lengths.
    """
    cfg = load_flat(ExtendConfig, name_or_path, PRESETS, "extend preset", overrides)
    check_config(cfg)
    given = (overrides or {}).get("passkey_schedules")
    if given and not cfg.passkey_lengths:
        raise PosencError(
            f"--passkey-schedules {' '.join(given)}: no passkey lengths (--passkey-lengths is empty), so no passkey "
            "trial would run"
        )
    if given and (unscored := [s for s in given if s not in cfg.schedules]):
        # a preset's list filters whatever --schedules picks; a given one names trials it wants run
        raise PosencError(
            f"--passkey-schedules {' '.join(unscored)}: not in --schedules ({' '.join(cfg.schedules)}), so no "
            "passkey trial would run on it (add it to --schedules)"
        )
    return cfg


def check_config(cfg: ExtendConfig) -> None:
    """What field bounds cannot say: schedule names, a schedule setting that some schedule of the run takes, and
    a stride that fits the shortest length."""
    for m in [*cfg.schedules, *(cfg.long_schedules or []), *(cfg.passkey_schedules or [])]:
        check_name(m)
    check_settings(cfg, cfg.schedules)
    for name in cfg.schedules:  # each setting's range; window and leak against L0 again once the model gives it
        schedules.extension_params(extension(cfg, name), cfg.original_max_position_embeddings or 1 << 20)
    for spec in cfg.schemes:  # names, parameters and values; sizes once the model is loaded
        hf.check_spec(spec)
    for spec in cfg.methods:  # the schedule underneath and the method's name and parameters (its defaults need L0)
        schedule, method = split_method(spec)
        check_name(schedule)
        if schedule in SWITCHES or schedule in ("rerope", "leaky-rerope"):
            raise PosencError(
                f"--method {spec!r}: a method goes on native RoPE or a fixed-frequency schedule (pi, ntk, yarn, llama3)"
            )
        long_context.check_supported(methods.parse(method, 1 << 20))  # any L0: the name and parameters
    if cfg.stream and not any(split_method(m)[1].split(":")[0] == "sinks" for m in cfg.methods):
        raise PosencError("--stream needs a bounded cache: give a sinks method (--method sinks:n_sink=4,window=W)")
    targets = min(cfg.lengths) - 1  # per window of the shortest length, either BOS policy
    if cfg.stride is not None and not 1 <= cfg.stride <= targets:
        raise PosencError(
            f"--stride must be in [1, {targets}] (targets per window of the shortest length), got {cfg.stride}"
        )


def check_settings(cfg: ScheduleSettings, names: list[str]) -> None:
    """PosencError naming a schedule setting of ``cfg`` that no schedule of ``names`` takes (it would be silently
    ignored)."""
    for key, param in SCHEDULE_KEYS.items():
        takers = [n for n, s in rope.SCHEDULES.items() if param in s.defaults]
        if getattr(cfg, key) is not None and not set(takers) & set(names):
            raise PosencError(
                f"{key} (--{key.replace('_', '-')}) is a setting of {', '.join(takers)}; no schedule of this run "
                f"({', '.join(names)}) takes it"
            )


def extension(cfg: ScheduleSettings, schedule: str) -> schedules.Extension:
    """Schedule ``schedule`` with ``cfg``'s settings: factor, L0 and each setting the schedule takes (a run's other
    schedules take the rest)."""
    takes = rope.SCHEDULES[check_name(schedule)].defaults
    given = {
        param: getattr(cfg, key)
        for key, param in SCHEDULE_KEYS.items()
        if param in takes and getattr(cfg, key) is not None
    }
    lists = {k: tuple(v) for k, v in given.items() if isinstance(v, list)}
    return schedules.Extension(
        schedule,
        cfg.factor,
        original_max_position_embeddings=cfg.original_max_position_embeddings,
        **{**given, **lists},
    )


def split_method(spec: str) -> tuple[str, str]:
    """(schedule, method spec) of a ``methods`` entry: ``self-extend:group=4`` on native RoPE ("none"),
    ``ntk+self-extend:group=4`` on NTK-aware frequencies (the Self-Extend paper's composition)."""
    schedule, plus, method = spec.partition("+")
    return (schedule, method) if plus else ("none", spec)


def method_label(schedule: str, method) -> str:
    """A method row's label: ``self-extend(group=4,window=4096)``, ``ntk+self-extend(...)`` on a schedule."""
    return method.describe() if schedule == "none" else f"{schedule}+{method.describe()}"


def held_out(cfg: ExtendConfig) -> list[Document]:
    """The held-out documents named by ``cfg.docs`` (checked before the model loads)."""
    val = load_corpus(cfg.corpus).val
    if cfg.docs == ["first"]:
        return val[:1]
    if cfg.docs == ["all"]:
        return val
    names = {d.name for d in val}
    missing = [n for n in cfg.docs if n not in names]
    if missing:
        raise PosencError(f"unknown document(s) {', '.join(missing)}; held-out: {', '.join(sorted(names))}")
    return [d for d in val if d.name in cfg.docs]


def _plan_windows(docs: list[tuple[str, list[int]]], length: int, cfg: ExtendConfig) -> list[tuple[str, Window]]:
    """(document, window) pairs scored at ``length``: every window of every document, the first ``max_windows``."""
    out = [
        (name, w)
        for name, toks in docs
        for w in perplexity.model_windows(len(toks), length, cfg.stride, cfg.bos == "prepend")
    ]
    if not out:
        longest = max(len(t) for _, t in docs)
        raise PosencError(
            f"length {length} exceeds the held-out text ({longest} tokens in the longest document "
            f"after --max-tokens {cfg.max_tokens})"
        )
    return out[: cfg.max_windows] if cfg.max_windows else out


def _skipped_a_target(record: ScoredWindow | PasskeyTrial) -> bool:
    """A --bos none window after the first from before the accounting fix (stride = length): its first target
    was never scored and its begin is off the current grid, so the record is ignored."""
    return (
        isinstance(record, ScoredWindow)
        and record.bos == "none"
        and record.stride >= record.length
        and record.begin > 0
    )


def _other_bos(record: ScoredWindow | PasskeyTrial, bos: str) -> bool:
    """A passkey trial whose prompt had another BOS policy than its setting's ``bos``: under --bos prepend, the
    trials of releases whose passkey prompts never had a BOS; ignored, so the trial runs again."""
    return isinstance(record, PasskeyTrial) and record.bos != bos


class _Store:
    """The records of one setting (``tag``, BOS policy ``bos``) in ``records.jsonl`` (``posenc.store.records``, kinds
    ``PRETRAINED``): appended one per window / trial and flushed at once, so an interrupted run resumes by skipping
    finished keys (a key recorded twice counts once; records an earlier version measured otherwise are
    ignored: :func:`_skipped_a_target`, :func:`_other_bos`)."""

    def __init__(self, path: Path, tag: str, bos: str = "none", bucket: int | None = None):
        drop_torn_tail(path)  # a record cut by a kill must not swallow the next one
        self.path, self.tag, self.bucket = path, tag, bucket  # bucket: the setting's width (perplexity.bucket_width)
        self.records, self.done = [], set()
        for r in load(path, PRETRAINED):
            if r.setting == tag and not _skipped_a_target(r) and not _other_bos(r, bos) and r.key not in self.done:
                self.records.append(r)
                self.done.add(r.key)
        self.by_sig = {}
        for r in self.records:
            if isinstance(r, ScoredWindow):
                self.by_sig.setdefault((r.signature, r.doc, r.begin, r.length), r)

    def add(self, record: ScoredWindow | PasskeyTrial) -> None:
        record = record.model_copy(update={"setting": self.tag})
        append(self.path, record)
        self.records.append(record)
        self.done.add(record.key)
        if isinstance(record, ScoredWindow):
            self.by_sig.setdefault((record.signature, record.doc, record.begin, record.length), record)


def _ppl_points(
    adapted: Adaptation,
    label: str,
    L: int,
    windows: list,
    doc_tokens: dict,
    store: _Store,
    cfg: ExtendConfig,
    bos_id: int | None,
) -> None:
    """Score the windows of one (adaptation ``label``, length) point, reusing forwards with an equal key
    (``Adaptation.key``)."""
    sig, bucket = adapted.key(L), perplexity.bucket_width(L, store.bucket)
    for doc, win in progress.bar(iterable=windows, desc=f"{label} ppl@{L}", unit="window", leave=False):
        key = f"ppl|{label}|{L}|{doc}|{win.begin}"
        if key in store.done:
            continue
        prev = store.by_sig.get((sig, doc, win.begin, L))
        t0 = time.time()
        if prev is not None:
            res = {k: getattr(prev, k) for k in ("nll_sum", "n_scored", "bucket_nll", "bucket_n")}
            res["reused_from"] = prev.adaptation
        else:
            adapted.reset_rotary()
            res = perplexity.score_window(adapted.model, doc_tokens[doc], win, bos_id, bucket)
        store.add(
            ScoredWindow(
                key=key,
                adaptation=label,
                factor=cfg.factor,
                length=L,
                stride=cfg.stride or L - 1,
                bos=cfg.bos,
                doc=doc,
                begin=win.begin,
                bucket=bucket,
                signature=sig,
                seconds=round(time.time() - t0, 2),
                **res,
            )
        )
        progress.note(
            f"{label:>12} L={L:>6} {doc}@{win.begin}: ppl {math.exp(res['nll_sum'] / res['n_scored']):.2f} "
            f"({res['n_scored']} tokens, {time.time() - t0:.0f} s{', reused' if prev else ''})"
        )


def _passkey_points(adapted: Adaptation, tok, label: str, store: _Store, cfg: ExtendConfig, bos_id: int | None) -> None:
    """Run the passkey trials of one adaptation (``label``) not yet recorded, each prompt after BOS ``bos_id`` when
    given."""
    for L in cfg.passkey_lengths:
        for depth in cfg.passkey_depths:
            for trial in range(cfg.trials):
                key = trial_key(label, L, depth, trial)
                if key in store.done:
                    continue
                t0 = time.time()
                adapted.reset_rotary()
                res = passkey.passkey_trial(
                    adapted.model,
                    tok,
                    L,
                    depth,
                    passkey.passkey_key(cfg.seed, L, depth, trial),
                    use_cache=not adapted.full_forward,
                    bos_id=bos_id,
                )
                store.add(
                    PasskeyTrial(
                        key=key,
                        adaptation=label,
                        factor=cfg.factor,
                        length=L,
                        depth=depth,
                        trial=trial,
                        seconds=round(time.time() - t0, 2),
                        bos=cfg.bos,
                        **res,
                    )
                )
                progress.note(
                    f"{label:>12} passkey L={L} depth={depth} trial={trial}: "
                    f"{'ok' if res['correct'] else 'wrong'} ({res['answer']!r}, {time.time() - t0:.0f} s)"
                )


def _write_config(path: Path, setting: dict, invocation: dict) -> None:
    """config.json: the setting, and every invocation (lengths, schedules, ...) run on it in this directory (a
    finetune run resumed with other scoring settings starts the list anew; ``posenc extend`` refuses another setting,
    :func:`check_same_setting`)."""
    old = read_json(path) if path.exists() else {}
    calls = old.get("invocations", []) if {k: old.get(k) for k in setting} == setting else []
    write_json(path, {**setting, "invocations": calls + [invocation]})


def run_setting(out: Path, cfg: ExtendConfig, docs: list[str]) -> dict:
    """The setting of ``cfg``'s records in the run directory ``out`` (what their tag hashes): ``SETTING``, the
    ``OPTIONAL_SETTING`` given, the weights' dtype unless float32, the held-out documents' names ``docs`` and the
    bucket width. Without ``cfg.bucket`` the width is the one ``out/config.json`` records, so that a run directory
    resumes on its own records; in a new directory it stays None."""
    config = out / "config.json"
    bucket = cfg.bucket if cfg.bucket is not None or not config.exists() else read_json(config).get("bucket")
    given = {k: getattr(cfg, k) for k in OPTIONAL_SETTING if getattr(cfg, k) is not None}
    weights = resolve_dtype(cfg.dtype)
    if weights != torch.float32:  # the default dtype, like an unset optional setting, stays out of the tag
        given["dtype"] = str(weights).removeprefix("torch.")
    return {**{k: getattr(cfg, k) for k in SETTING}, **given, "bucket": bucket, "docs": list(docs)}


def check_same_setting(out: Path, cfg: ExtendConfig, docs: list[str]) -> None:
    """PosencError (``posenc.store.presets.refuse_other_settings``, compare's refusal) when the run directory ``out``
    holds results of another setting than ``cfg``'s (:func:`run_setting`; ``docs``: the held-out documents'
    names): a rerun would replace its config.json and report with the new setting's. Checked before the model
    loads."""
    config = out / "config.json"
    if not config.exists():
        return
    old = read_json(config)
    keys = (*SETTING, *OPTIONAL_SETTING, "dtype", "bucket", "docs")
    now = json.loads(json.dumps(run_setting(out, cfg, docs)))  # as config.json holds it: tuples as lists
    refuse_other_settings(out, {k: old[k] for k in keys if k in old}, now)


def open_store(out: Path, cfg: ExtendConfig, docs: list, l0: int, source: str) -> _Store:
    """Record this call in ``config.json`` and open the records of its setting (:func:`run_setting`)."""
    setting = run_setting(out, cfg, [d for d, _ in docs])
    tag = hashlib.sha256(json.dumps(setting, sort_keys=True).encode()).hexdigest()[:12]
    weights = resolve_dtype(cfg.dtype)
    invocation = {**{k: getattr(cfg, k) for k in INVOCATION}, "stamp": run_stamp(weights=weights)}
    _write_config(out / "config.json", {**setting, "native_context": l0, "source": source}, invocation)
    return _Store(out / "records.jsonl", tag, cfg.bos, setting["bucket"])


def eval_inputs(
    cfg: ExtendConfig, loaded: loading.Loaded, documents: list[Document]
) -> tuple[int, list, dict, int | None]:
    """Native context L0, (document, tokens) pairs, windows per length and BOS id of ``cfg`` for a loaded model
    and the held-out ``documents`` (:func:`held_out`): every input checked (PosencError as :func:`extend`)."""
    l0 = cfg.original_max_position_embeddings or schedules.native_context(loaded.model.config)
    for name in cfg.schedules:  # window and leak against L0
        schedules.extension_params(extension(cfg, name), l0)
    for spec in cfg.schemes:  # built for the model's sizes, not yet applied
        hf.layer_schemes(loaded.model, spec)
    for spec in cfg.methods:  # the defaults from L0; exact positions within what the schedule reaches (Adaptation's)
        schedule, method = split_method(spec)
        methods.check_reach(methods.parse(method, l0), l0, cfg.factor if schedule != "none" else 1)
    tok = loaded.tokenizer
    docs = [(d.name, text_ids(tok, d.text)[: cfg.max_tokens]) for d in documents]
    bos_id = tok.bos_token_id if cfg.bos == "prepend" else None
    if cfg.bos == "prepend" and bos_id is None:
        raise PosencError(f"{cfg.model} has no BOS token; use --bos none")
    if cfg.passkey_lengths:  # a prompt too long for the shortest passkey length fails now, not after scoring
        passkey.passkey_prompt(tok, min(cfg.passkey_lengths), cfg.passkey_depths[0], 99999, bos_id)
    plan = {L: _plan_windows(docs, L, cfg) for L in cfg.lengths}
    long = [L for L in cfg.lengths if L > cfg.factor * l0]
    if long and cfg.long_schedules is not None and not set(cfg.long_schedules) & set(cfg.schedules):
        raise PosencError(
            f"--lengths {' '.join(map(str, long))} exceed factor x native length = {cfg.factor * l0:g}, where "
            f"only --long-schedules ({' '.join(cfg.long_schedules) or 'none'}) are scored, and --schedules has "
            "none of them: nothing would score there (add one to --schedules, or give a bare --long-schedules)"
        )
    if (
        cfg.passkey_lengths
        and cfg.passkey_schedules is not None
        and not set(cfg.passkey_schedules) & set(cfg.schedules)
    ):
        print(
            f"posenc: warning: no schedule of --schedules ({' '.join(cfg.schedules)}) is in --passkey-schedules "
            f"({' '.join(cfg.passkey_schedules) or 'none'}): no schedule runs passkey trials",
            file=sys.stderr,
        )
    return l0, docs, plan, bos_id


def text_ids(tokenizer, text: str) -> list[int]:
    """Token ids of a document's text (a Hugging Face tokenizer, no special tokens added). A string spelling a
    special token ('<s>', '</s>') is text like any other, never the special id: a document quoting '<s>'
    would otherwise get a BOS in its middle."""
    return tokenizer(text, add_special_tokens=False, split_special_tokens=True)["input_ids"]


def extend(cfg: ExtendConfig, out: Path | None = None) -> tuple[Path, str]:
    """Score every (adaptation, length) window and passkey trial of ``cfg`` not yet recorded, then write the report.

    ``out``: the run directory (default ``runs/extend/<cfg.name>``). Returns it and the
    report's markdown (also in ``out/results.md``). Raises PosencError before ``out`` is
    touched for an unknown document, a model posenc cannot load or extend, a ReRoPE window
    or leak invalid for the model's native context L0, a length longer than the held-out
    text, a length beyond factor x L0 that no schedule would score (``long_schedules``), ``bos: prepend`` without a
    BOS token, an ``out`` that cannot be made a directory (a file in the way: ``check_run_dir``), or one that holds
    results of another setting (:func:`check_same_setting`).
    """
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    out = Path(out or Path("runs") / "extend" / cfg.name)
    check_run_dir(out)  # before the model loads and the work; nothing is created yet
    hold_run_dir(out)  # an existing one held before its records are read (posenc.store.lock)
    documents = held_out(cfg)  # a bad document name fails before the model loads
    check_same_setting(out, cfg, [d.name for d in documents])  # another setting's results: refused, kept
    loaded = loading.load(cfg.model, cfg.dtype)
    l0, docs, plan, bos_id = eval_inputs(cfg, loaded, documents)
    open_run_dir(out)  # all input checked: only now touch the output directory
    store = open_store(out, cfg, docs, l0, loaded.source)
    adapted = Adaptation(loaded.model)
    for name in cfg.schedules:
        adapted.set_schedule(extension(cfg, name))
        for L in cfg.lengths:
            if L <= cfg.factor * l0 or cfg.long_schedules is None or name in cfg.long_schedules:
                _ppl_points(adapted, name, L, plan[L], dict(docs), store, cfg, bos_id)
        if name in (cfg.passkey_schedules or cfg.schedules):
            _passkey_points(adapted, loaded.tokenizer, name, store, cfg, bos_id)
    method_rows = [
        _method_points(adapted, loaded.tokenizer, spec, plan, dict(docs), store, cfg, bos_id) for spec in cfg.methods
    ]
    for spec in cfg.schemes:  # last: the model keeps the posenc attention (each scheme replaces the native RoPE)
        _scheme_points(adapted, loaded.tokenizer, spec, plan, dict(docs), store, cfg, l0, bos_id)
    labels = method_rows + [SCHEME_LABEL + s for s in cfg.schemes]
    labels += sorted({r.adaptation for r in store.records if r.adaptation.startswith(SCHEME_LABEL)} - set(labels))
    rows = [m for m in NAMES if m in cfg.schedules or any(r.adaptation == m for r in store.records)] + labels
    stamp = read_json(out / "config.json")["invocations"][-1]["stamp"]  # the one open_store recorded
    return out, report.write_report(out, store.records, rows, _header(cfg, l0, docs, store.records, stamp))


def _method_points(
    adapted: Adaptation,
    tok,
    spec: str,
    plan: dict,
    doc_tokens: dict,
    store: _Store,
    cfg: ExtendConfig,
    bos_id: int | None,
) -> str:
    """Perplexity at every length and passkey of the model under method ``spec`` (on its schedule, ``split_method``),
    then the model restored; returns the row's label. Every length: the methods are for inputs beyond L0."""
    schedule, method = split_method(spec)
    adapted.set_schedule(extension(cfg, schedule))
    label = method_label(schedule, adapted.set_method(method))
    measure(adapted, tok, label, cfg.lengths, plan, doc_tokens, store, cfg, bos_id)
    if cfg.stream and adapted.method.bounded:
        _stream_point(adapted, label, doc_tokens, store.path.parent, cfg.stream)
    adapted.restore()
    return label


def _stream_point(adapted: Adaptation, label: str, doc_tokens: dict, out: Path, targets: int) -> None:
    """The first ``targets`` targets of the held-out documents, joined in order, streamed through the bounded
    cache (``sink_cache.streaming_nll``): ``stream_<label>.json`` (perplexity, eight position buckets, the peak
    cache in bytes, seconds) and its perplexity per position (``stream_<label>.png``); kept if already there."""
    from posenc.hf.sink_cache import streaming_nll  # imports transformers

    path = out / f"stream_{re.sub(r'[^A-Za-z0-9=._-]', '_', label)}.json"
    if path.exists() and read_json(path)["targets_asked"] == targets:
        return
    joined = np.concatenate([doc_tokens[d] for d in doc_tokens])[: targets + 1]
    t0 = time.time()
    nll, peak = streaming_nll(adapted.model, adapted.method, torch.as_tensor(joined, dtype=torch.int64))
    nll = nll.double().numpy()
    edges, buckets = perplexity.stream_buckets(nll)
    record = {
        "label": label,
        "targets_asked": targets,
        "targets": len(nll),
        "ppl": math.exp(float(nll.mean())),
        "bucket_edges": edges,
        "bucket_ppl": buckets,
        "peak_cache_bytes": peak,
        "seconds": time.time() - t0,
    }
    plot_stream(nll, path.with_suffix(".png"), f"{label} streamed")
    write_json(path, record)
    progress.note(f"{label} streamed: ppl {record['ppl']:.3f} over {len(nll)} targets, peak cache {peak} bytes")


def _scheme_points(
    adapted: Adaptation,
    tok,
    spec: str,
    plan: dict,
    doc_tokens: dict,
    store: _Store,
    cfg: ExtendConfig,
    l0: int,
    bos_id: int | None,
) -> None:
    """Perplexity (lengths up to factor x L0, all with a bare --long-schedules) and passkey (every passkey length)
    of the model with scheme ``spec`` in its attention, without fine-tuning."""
    adapted.set_scheme(spec)
    lengths = [L for L in cfg.lengths if L <= cfg.factor * l0 or cfg.long_schedules is None]
    measure(adapted, tok, SCHEME_LABEL + spec, lengths, plan, doc_tokens, store, cfg, bos_id)


def measure(
    adapted: Adaptation,
    tok,
    label: str,
    lengths: list[int],
    plan: dict,
    doc_tokens: dict,
    store: _Store,
    cfg: ExtendConfig,
    bos_id: int | None,
) -> None:
    """Record perplexity at ``lengths`` (windows from ``plan``) and passkey (``cfg.passkey_lengths``) of the
    adapted model as it is now, under ``label``; points already in ``store`` are skipped."""
    for L in lengths:
        _ppl_points(adapted, label, L, plan[L], doc_tokens, store, cfg, bos_id)
    _passkey_points(adapted, tok, label, store, cfg, bos_id)


def _header(cfg: ExtendConfig, l0: int, docs: list, records: list, stamp: dict) -> str:
    """The report's first lines: model, L0, factor, text, the windows each point scored (from ``records``:
    ``--max-windows`` keeps the first ones, in document order), BOS policy, passkey scoring, and the run stamp of
    this invocation (``config.json`` keeps every invocation's: points scored by earlier ones keep their numbers)."""
    counts = sorted(set(Counter((r.adaptation, r.length) for r in records if isinstance(r, ScoredWindow)).values()))
    n = "no" if not counts else f"{counts[0]}" + (f"-{counts[-1]}" if len(counts) > 1 else "")
    return (
        f"# posenc extend: {cfg.model} (native context {l0}, factor {cfg.factor:g})\n\n"
        f"Text: {', '.join(d for d, _ in docs)} (each cut to its first {cfg.max_tokens} tokens); each point scores "
        f"{n} window(s) of its length, the first in document order (tokens per point below), "
        f"BOS policy {cfg.bos}, {'stride ' + str(cfg.stride) if cfg.stride else 'non-overlapping windows'}; "
        f"passkey greedy, first integer of the output compared exactly.\n\n"
        f"Run: {stamp_line(stamp)} (every invocation's stamp: `config.json`)"
    )
