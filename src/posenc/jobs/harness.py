"""posenc as an lm-evaluation-harness model (``lm_eval``, the ``harness`` extra): :class:`PosencLM`, registered as
``posenc`` when this module is imported (``import posenc.harness`` does it; lm-eval 0.4.13 discovers no models of
other packages by itself).

``--model_args`` (lm-eval's ``key=value,...``): ``pretrained`` a posenc train run directory (its scheme and
tokenizer: byte or BPE), a posenc finetune run directory (its recorded scheme or schedule and trained weights), or a
Hugging Face RoPE model as ``posenc.hf.loading.load`` takes it (``smollm2``, a ``.gguf`` file, a model directory, a
hub id); ``schedule`` a RoPE schedule with the settings of ``posenc.jobs.extend.ScheduleSettings`` as further keys
(``schedule=yarn,factor=4``); ``method`` a long-context method (``posenc.methods.parse``); ``scheme`` a posenc scheme
(pretrained models). The keys after ``method=`` or ``scheme=`` that are none of the above are that spec's own
(lm-eval splits ``method=self-extend:group=8,window=1024`` at its comma: ``window=1024`` joins the method again).
``truncation=true`` cuts requests longer than the adaptation reaches from the left, as lm-eval's ``hf`` model does;
without it they are refused (PosencError). ``tokenizer`` is read by RULER's tasks only (a directory or hub id of the
model's tokenizer, for a GGUF: ``posenc harness`` writes one). Requests run one at a time (``batch_size`` 1); each
result goes to lm-eval's request cache as it is computed (``use_cache``), so a killed evaluation resumes without
recomputing it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
import sys
import typing
import warnings
from pathlib import Path

import torch
from lm_eval.api.model import TemplateLM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window
from tqdm import tqdm

from posenc import encodings
from posenc.encodings.registry import split_part
from posenc.errors import PosencError, first_line
from posenc.hf import generation, loading
from posenc.hf.adaptation import Adaptation
from posenc.hf.schedules import original_length
from posenc.jobs import extend, finetune
from posenc.methods import PARAMETERS
from posenc.model import set_method, with_rope_schedule
from posenc.reports.render import figure, markdown_table, save_figure, write_csv_table
from posenc.rope import NAMES, check_name
from posenc.store.checkpoint import (
    append_jsonl,
    atomic_write_bytes,
    check_run_dir,
    make_run_dir,
    read_json,
    refuse_run_dir,
    write_json,
)
from posenc.store.lock import hold_run_dir, open_run_dir
from posenc.store.presets import validated
from posenc.store.stamp import WeightsDtype, resolve_dtype, run_stamp
from posenc.train.rundir import load_text_run, run_tokens

NAME = "posenc"  # the model name in lm-eval's registry
SETTINGS = set(extend.ScheduleSettings.model_fields)  # schedule keys (factor, beta_fast, ...)
# truncation as lm-eval's hf model names it (truncate is YaRN's setting)
OWN_KEYS = {"pretrained", "schedule", "method", "scheme", "truncation", "tokenizer", "dtype"}
GEN_KEYS = {"until", "max_gen_toks", "do_sample", "temperature", "top_k"}
MAX_GEN_TOKS = 256  # lm-eval's default for generate_until
FAR = 1 << 22  # tokens (4,194,304): past any evaluation; a method whose reach there stays short is bounded


@dataclasses.dataclass
class ModelArgs:
    """The parsed ``--model_args``: ``pretrained``, ``schedule`` and its ``settings`` (``ScheduleSettings`` keys),
    ``method``, ``scheme``, ``truncation``, ``dtype`` (a pretrained model's: ``posenc.store.stamp.resolve_dtype``)."""

    pretrained: str
    schedule: str | None = None
    settings: dict = dataclasses.field(default_factory=dict)
    method: str | None = None
    scheme: str | None = None
    truncation: bool = False
    dtype: str = "float32"


def parse_model_args(kwargs: dict) -> ModelArgs:
    """``--model_args`` as lm-eval hands them (values already typed by its parser; key order kept) -> ModelArgs.
    A key that is neither posenc's nor a schedule setting continues the ``method`` or ``scheme`` spec given before
    it (lm-eval split that spec at its commas). PosencError (one line) for a missing ``pretrained``, a stray key,
    schedule settings without ``schedule``."""
    args, open_spec = {"settings": {}}, None
    for key, value in kwargs.items():
        text = "none" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
        if key in ("method", "scheme"):
            args[key], open_spec = text, key
        elif key in OWN_KEYS:
            args[key] = value
        elif key in SETTINGS:
            args["settings"][key] = value
        elif open_spec is not None:
            args[open_spec] += f",{key}={text}"
        else:
            raise PosencError(
                f"model_args: unknown key {key!r} (posenc's: {', '.join(sorted(OWN_KEYS))}, and the schedule "
                f"settings {', '.join(sorted(SETTINGS))})"
            )
    if not args.get("pretrained"):
        raise PosencError("model_args: give pretrained=MODEL (a posenc run directory, smollm2, a .gguf, a hub id)")
    for key in ("method", "scheme", "schedule"):
        if args.get(key) in ("none", None):
            args[key] = None
    if args["settings"] and args.get("schedule") is None:
        raise PosencError(f"model_args: {next(iter(args['settings']))} is a schedule setting: it needs schedule=NAME")
    args["truncation"] = args.get("truncation") in (True, "true", "True", "1", 1)
    args.pop("tokenizer", None)
    args["pretrained"] = str(args["pretrained"])
    dtypes = typing.get_args(WeightsDtype)
    if str(args.setdefault("dtype", "float32")) not in dtypes:
        raise PosencError(f"model_args: dtype must be one of {', '.join(dtypes)}, got {args['dtype']!r}")
    return ModelArgs(**args)


def check_model_args(args: ModelArgs) -> str:
    """The kind of ``args.pretrained`` (``posenc.jobs.finetune.model_kind``: train, finetune, pretrained), after the
    checks of ``args`` that need no weights, so that ``posenc harness`` makes them for every adaptation before it
    writes anything: PosencError (one line) for a dtype other than float32 on a posenc run, a schedule, scheme or
    method on a finetune run (it is evaluated as trained), a scheme on a train run or with a schedule or method,
    invalid or unused schedule settings (``posenc.jobs.extend.ScheduleSettings``), an unknown method, a scheme spec
    that does not parse (unknown names or parameters)."""
    kind = finetune.model_kind(args.pretrained)
    if args.dtype != "float32" and kind != "pretrained":
        raise PosencError(f"model_args: dtype={args.dtype} is for pretrained models; a {kind} run is float32")
    if kind == "finetune" and (args.schedule or args.scheme or args.method):
        raise PosencError(
            f"{args.pretrained} is a finetune run: it is evaluated with the scheme or schedule it was trained "
            "with (no schedule, scheme or method)"
        )
    if kind == "train" and args.scheme is not None:
        raise PosencError(f"{args.pretrained} is a posenc train run: it is evaluated with its own scheme")
    if args.scheme is not None and (args.schedule or args.method):
        raise PosencError("model_args: a scheme replaces RoPE: give no schedule or method with it")
    if args.schedule is not None and kind == "pretrained":
        check_name(args.schedule)
        extend.check_settings(validated(extend.ScheduleSettings, args.settings, "schedule settings"), [args.schedule])
    method = None if args.method is None else split_part(args.method, "method")[0]
    if method is not None and method not in PARAMETERS:  # its values are checked against the model's L0 (parse)
        raise PosencError(f"unknown method {method!r} (methods: {', '.join(PARAMETERS)})")
    if args.scheme is not None:
        for entry in encodings.layer_pattern(args.scheme):
            encodings.parts(entry)
    return kind


def method_reach(method, limit: int) -> int | None:
    """The longest sequence (tokens) whose largest attended distance under ``method`` stays below ``limit``
    positions (``posenc.methods.Method.reach``), or None when it never reaches ``limit`` (LM-Infinite, sinks,
    dual-chunk: bounded distances)."""

    def reach(n: int) -> int:
        pos = torch.arange(n)
        return method.reach(pos, pos)

    if reach(FAR) < limit:
        return None
    lo, hi = 1, FAR  # reach(lo) < limit <= reach(hi): reach grows with the length
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if reach(mid) < limit else (lo, mid)
    return lo


class _Pretrained:
    """A Hugging Face model with posenc's adaptation (``posenc.hf.adaptation.Adaptation``), its tokenizer, and
    the longest sequence the adaptation reaches: L0 native, s L0 under a schedule of factor s, any length under
    ReRoPE, and under a method the length at which its largest distance reaches that."""

    def __init__(self, args: ModelArgs):
        if finetune.model_kind(args.pretrained) == "finetune":
            loaded, self.adapted, self.label = finetune.load_finetuned(Path(args.pretrained))
        else:
            loaded = loading.load(args.pretrained, args.dtype)
            self.adapted = Adaptation(loaded.model)
            if args.scheme is not None:
                self.adapted.set_scheme(args.scheme)
            elif args.schedule is not None:
                settings = validated(extend.ScheduleSettings, args.settings, "schedule settings")
                self.adapted.set_schedule(extend.extension(settings, args.schedule))
            if args.method is not None:
                self.adapted.set_method(args.method)
            self.label = ", ".join(
                x for x in (args.schedule, args.method and self.adapted.method.label(), args.scheme) if x
            )
        self.tokenizer = loaded.tokenizer
        self.model = loaded.model
        self.eos = self.model.generation_config.eos_token_id
        self.max_length = self._reach()

    def _reach(self) -> int | None:
        a = self.adapted
        ext, l0 = a.extension, a.l0
        if a.scheme is not None:
            return None  # a posenc scheme: its own extrapolation, no position table
        if a.rerope is not None and a.rerope[2] is None:
            limit = None  # ReRoPE: distances past w are w
        elif ext.schedule == "none":
            limit = l0
        else:
            limit = int(ext.factor * original_length(ext, l0))
        if a.method is None or limit is None:
            return limit
        return method_reach(a.method, limit)

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return self.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    @torch.inference_mode()
    def logprobs(self, ids: torch.Tensor, n: int) -> torch.Tensor:
        """Log-probabilities (n, vocab) float32 of the last n tokens of ``ids`` (T,) int64 given those before."""
        return torch.log_softmax(self.model(input_ids=ids[None, :-1], logits_to_keep=n).logits[0].float(), -1)

    def generate(self, ids: torch.Tensor, max_new: int, temperature: float, top_k: int | None) -> list[int]:
        out = generation.generate(self.adapted, ids, max_new, temperature, top_k, seed=0, eos_token_id=self.eos)
        return out[ids.numel() :].tolist()


class _Own:
    """A posenc train run: its model (RoPE schedule and method put in), its tokenizer (byte or BPE). No length limit
    but a learned position table's (``LM.check_length``)."""

    def __init__(self, args: ModelArgs):
        self.model, _, tcfg = load_text_run(Path(args.pretrained), "harness")
        if args.schedule is not None:
            params = {extend.SCHEDULE_KEYS.get(k, k): v for k, v in args.settings.items()}  # posenc.rope's names
            self.model, _ = with_rope_schedule(self.model, args.schedule, params)
        self.method = set_method(self.model, args.method)
        self.model.eval()
        self.tok = run_tokens(Path(args.pretrained), tcfg).tokenizer
        self.label = ", ".join(x for x in (args.schedule, self.method and self.method.label()) if x)
        self.max_length = None

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return [int(i) for i in self.tok.encode(text)]

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids)

    @torch.inference_mode()
    def logprobs(self, ids: torch.Tensor, n: int) -> torch.Tensor:
        hidden = self.model.hidden(ids[None, :-1].to(self.model.tok.weight.device))[0, -n:]
        return torch.log_softmax((hidden @ self.model.tok.weight.T).float(), -1).cpu()

    @torch.inference_mode()
    def generate(self, ids: torch.Tensor, max_new: int, temperature: float, top_k: int | None) -> list[int]:
        out = self.model.generate(ids.to(self.model.tok.weight.device), max_new, temperature, top_k, seed=0)
        return out[ids.numel() :].tolist()


@register_model(NAME)
class PosencLM(TemplateLM):
    """Any model posenc runs, as an lm-eval model (the module's docstring: model_args). Log-likelihoods are
    posenc's scoring of the same tokens (float32 log-softmax of the model's logits); generation is
    ``posenc generate``'s (``posenc.hf.generation.generate`` or ``LM.generate``, seed 0), cut at the first stop
    sequence; a CUDA device where there is none runs on the CPU (a warning). Raises PosencError (one line) for bad
    model_args, batch_size other than 1, a request longer than the adaptation reaches (unless ``truncation``),
    unknown generation settings."""

    def __init__(self, batch_size=1, max_batch_size=None, device=None, **model_args):
        super().__init__()
        if str(batch_size) != "1":
            raise PosencError(f"posenc's lm-eval model runs one request at a time: batch_size 1, got {batch_size}")
        if device is not None and str(device).startswith("cuda") and not torch.cuda.is_available():
            # lm-eval's command passes cuda:0 unless told otherwise; its hf model falls back to the CPU too
            warnings.warn(f"device {device}: no CUDA device here, running on the CPU", stacklevel=2)
            device = "cpu"
        self.args = parse_model_args(model_args)
        kind = check_model_args(self.args)
        self.backend = _Own(self.args) if kind == "train" else _Pretrained(self.args)
        self._device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        if kind != "train":
            self.backend.model.to(self._device)
        self.kind = kind

    # ------------------------------------------------------------ tokens

    @property
    def eot_token_id(self) -> int:
        """The end-of-text id: the tokenizer's EOS; a posenc train run's, the last token of the document separator
        it trained on (``"\\n\\n"``: ``posenc.data.corpora.load_tokens`` joins documents with it)."""
        if self.kind == "train":
            return self.backend.encode("\n\n", False)[-1]
        return self.backend.tokenizer.eos_token_id

    @property
    def prefix_token_id(self) -> int:
        """What an empty context and a rolling window's first token are scored after: BOS where the tokenizer has
        one, else :attr:`eot_token_id` (lm-eval's ``hf`` model's rule)."""
        bos = None if self.kind == "train" else self.backend.tokenizer.bos_token_id
        prefix = self.eot_token_id if bos is None else bos
        if prefix is None:
            raise PosencError(
                f"the tokenizer of {self.args.pretrained} has neither BOS nor EOS: no token to score a text's first "
                "token after (rolling log-likelihoods, empty contexts)"
            )
        return prefix

    @property
    def max_length(self) -> int | None:
        """The longest sequence (tokens) the adaptation reaches, None: no limit."""
        return self.backend.max_length

    def tok_encode(self, string: str, add_special_tokens: bool | None = None, **kwargs) -> list[int]:
        return self.backend.encode(string, bool(add_special_tokens))

    def tok_decode(self, ids: list[int]) -> str:
        return self.backend.decode(ids)

    @property
    def tokenizer_name(self) -> str:
        if self.kind == "train":
            raise PosencError("a posenc train run has no chat template")
        return self.backend.tokenizer.name_or_path.replace("/", "__")

    def apply_chat_template(self, chat_history: list[dict[str, str]], add_generation_prompt: bool = True) -> str:
        if self.kind == "train":
            raise PosencError("a posenc train run has no chat template: run without --apply_chat_template")
        return self.backend.tokenizer.apply_chat_template(
            chat_history, tokenize=False, add_generation_prompt=add_generation_prompt
        )

    def _fit(self, ids: list[int], room: int, what: str) -> list[int]:
        """``ids`` if they and ``room`` more tokens fit :attr:`max_length`; else their last tokens that do under
        ``truncation``, or PosencError naming the lengths."""
        limit = self.max_length
        if limit is None or len(ids) + room <= limit:
            return ids
        if not self.args.truncation or room >= limit:
            raise PosencError(
                f"{what} of {len(ids) + room:,} tokens is past what {self.backend.label or 'native RoPE'} reaches "
                f"({limit:,} tokens): give a schedule or method that reaches it, or truncation=true"
            )
        return ids[len(ids) + room - limit :]

    # ------------------------------------------------------------ scoring

    def _score(self, context: list[int], continuation: list[int]) -> tuple[float, bool]:
        n = len(continuation)
        if n == 0:  # nothing to score (and logits_to_keep=0 would keep every position)
            return 0.0, True
        ids = self._fit(context + continuation, -1, "a request")  # the last token is only a target
        lp = self.backend.logprobs(torch.tensor(ids, dtype=torch.int64), n)
        target = torch.tensor(continuation, dtype=torch.int64)
        return float(lp.gather(1, target[:, None]).sum()), bool((lp.argmax(-1) == target).all())

    def _loglikelihood_tokens(self, requests, disable_tqdm: bool = False, **kwargs) -> list[tuple[float, bool]]:
        out = []
        for key, context, continuation in tqdm(requests, desc="posenc loglikelihood", disable=disable_tqdm):
            out.append(self._score(context, continuation))
            if key is not None:
                self.cache_hook.add_partial("loglikelihood", key, out[-1])
        return out

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """The log-likelihood of each whole text (``Instance.args``: (text,)), every token scored once: one forward
        after the prefix token, or lm-eval's disjoint rolling windows of :attr:`max_length` when it is longer."""
        out = []
        for (text,) in tqdm([r.args for r in requests], desc="posenc loglikelihood_rolling", disable=disable_tqdm):
            ids = self.tok_encode(text)
            limit = self.max_length or len(ids) + 1
            windows = map(
                make_disjoint_window,
                get_rolling_token_windows(ids, self.prefix_token_id, limit, context_len=1),
            )
            out.append(sum(self._score(list(c), list(t))[0] for c, t in windows))
            self.cache_hook.add_partial("loglikelihood_rolling", (text,), out[-1])
        return out

    # ------------------------------------------------------------ generation

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        """Greedy (or sampled: ``do_sample``, ``temperature``, ``top_k``) continuation of each context, up to
        ``max_gen_toks`` tokens or the tokenizer's EOS, cut before the first of the ``until`` strings."""
        out = []
        for context, gen_kwargs in tqdm([r.args for r in requests], desc="posenc generate", disable=disable_tqdm):
            out.append(self._generate(context, dict(gen_kwargs)))
            self.cache_hook.add_partial("generate_until", (context, gen_kwargs), out[-1])
        return out

    def _generate(self, context: str, kw: dict) -> str:
        unknown = sorted(set(kw) - GEN_KEYS)
        if unknown:
            raise PosencError(f"gen_kwargs: {unknown[0]!r} is not taken here (taken: {', '.join(sorted(GEN_KEYS))})")
        until = kw.get("until") or []
        until = [until] if isinstance(until, str) else list(until)
        max_new = int(kw.get("max_gen_toks", MAX_GEN_TOKS))
        temperature = float(kw.get("temperature", 0.0)) if kw.get("do_sample") else 0.0
        ids = self._fit(self.tok_encode(context), max_new, "a prompt and its max_gen_toks")
        new = self.backend.generate(torch.tensor(ids, dtype=torch.int64), max_new, temperature, kw.get("top_k"))
        text = self.tok_decode(new)
        cut = min((i for i in (text.find(s) for s in until if s) if i >= 0), default=len(text))
        return text[:cut]


def wilson(successes: float, n: int, z: float = 1.959964) -> tuple[float, float]:
    """The 95% Wilson score interval (low, high) of a proportion ``successes`` / ``n`` (n >= 1)."""
    p = successes / n
    centre, half = p + z * z / (2 * n), z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, (centre - half) / (1 + z * z / n)), min(1.0, (centre + half) / (1 + z * z / n))


# ---------------------------------------------------------------- posenc harness: tasks x lengths x adaptations


def adaptation_args(spec: str) -> dict:
    """An adaptation of the grid as model_args: ``none``; a schedule ``NAME[:setting=v,...]`` (``yarn:factor=2``);
    a method ``NAME:...`` (``self-extend:group=8,window=1024``), on a schedule as ``SCHEDULE[:...]+METHOD[:...]``;
    ``scheme:SPEC``. PosencError (one line) for a name that is none of these."""
    if spec == "none":
        return {}
    if spec.startswith("scheme:"):
        return {"scheme": spec.removeprefix("scheme:")}
    schedule, plus, method = spec.rpartition("+")
    if not plus:
        schedule, method = (spec, "") if spec.partition(":")[0] in NAMES else ("", spec)
    out = {"method": method} if method else {}
    if method and split_part(method, "method")[0] not in PARAMETERS:
        raise PosencError(
            f"adaptation {spec!r}: unknown method or schedule (methods: {', '.join(PARAMETERS)}; "
            f"schedules: {', '.join(NAMES)})"
        )
    if schedule:
        name, given = split_part(schedule, "schedule")
        check_name(name)
        out |= {"schedule": name, **given}
    return out


def cell_name(adaptation: str, task: str, length: int) -> str:
    """The cell's record file name: the adaptation with path-safe characters, the task, the length."""
    safe = "".join(c if c.isalnum() or c in "-_.=" else "_" for c in adaptation)
    return f"{safe}__{task}__{length}.json"


def score_cell(result: dict, task: str, length: int) -> tuple[str, list[float]]:
    """(metric, per-sample scores in [0, 1]) of one ``simple_evaluate`` result with its samples: RULER reports a
    sample under its length (``"4096"``; -1 under the others), other tasks under their first metric."""
    metrics = [k.split(",")[0] for k in result["results"][task] if "," in k and "_stderr" not in k]
    metric = str(length) if str(length) in metrics else metrics[0]
    return metric, [float(s[metric]) for s in result["samples"][task] if float(s[metric]) != -1]


def run_cell(lm, task: str, length: int, limit: int | None, cache: Path, tokenizer: str | None) -> dict:
    """One task at one length through ``lm_eval.simple_evaluate`` with the request cache ``cache`` (a killed cell
    resumes at its first sample not cached): metric, score (mean), n, its 95% Wilson interval, seconds."""
    import time

    from lm_eval import simple_evaluate

    start = time.monotonic()
    metadata = {"max_seq_lengths": [length], **({"tokenizer": tokenizer} if tokenizer else {})}
    try:  # lm-eval's tasks print notices (nltk's downloads) on stdout, where posenc harness prints its table
        with contextlib.redirect_stdout(sys.stderr):
            result = simple_evaluate(
                model=lm,
                tasks=[task],
                limit=limit,
                use_cache=str(cache),
                log_samples=True,
                bootstrap_iters=0,
                metadata=metadata,
            )
    except ValueError as exc:  # RULER's generators refuse a length their haystack and question do not fit
        if "Could not generate any sample" not in str(exc):
            raise
        raise PosencError(
            f"{task} builds no sample of {length} tokens (its prompt does not fit): raise --lengths"
        ) from None
    metric, scores = score_cell(result, task, length)
    if not scores:
        raise PosencError(f"{task} at {length} tokens gave no sample (is the length one the task generates?)")
    low, high = wilson(sum(scores), len(scores))
    return {
        "metric": metric,
        "score": sum(scores) / len(scores),
        "n": len(scores),
        "low": low,
        "high": high,
        "seconds": round(time.monotonic() - start, 1),
    }


def grid(
    model: str,
    tasks: list[str],
    lengths: list[int],
    adaptations: list[str],
    out: Path,
    limit: int | None = None,
    tokenizer: str | None = None,
    dtype: str = "float32",
) -> str:
    """``posenc harness``: every task at every length for every adaptation of pretrained ``model``, through
    :class:`PosencLM` and lm-eval; writes ``out/cells/*.json`` (one record per finished cell, atomic: a rerun skips
    them), ``out/cache/`` (lm-eval's request cache: a killed cell resumes at its first sample not scored),
    ``out/invocations.jsonl`` (each call's stamp: versions, commit, device, threads, precision, command),
    ``out/table.md``, ``table.csv`` and ``plot.png``; returns the table. ``tokenizer``: what RULER's tasks size their
    prompts with (None: the model's own, saved to ``out/tokenizer``); ``dtype``: the weights' and compute's
    (``posenc.store.stamp.WeightsDtype``; "auto" resolved here), recorded in each cell, and an ``out`` holding cells
    of another dtype is refused. PosencError (one line) for a bad adaptation before anything is written: every
    adaptation's model_args and ``out`` (``check_run_dir``) checked before any model loads, and ``out`` made once
    the first model to evaluate is adapted (an error that needs the weights, such as a scheme the model cannot take,
    then also comes first); else as :class:`PosencLM`."""
    dtype = str(resolve_dtype(dtype)).removeprefix("torch.") if dtype == "auto" else dtype
    args = {a: adaptation_args(a) | {"dtype": dtype} for a in adaptations}
    kinds = {check_model_args(parse_model_args({"pretrained": model, **args[a]})) for a in adaptations}
    if tokenizer is not None:
        check_tokenizer(tokenizer)
    elif "train" in kinds and (ruler := ruler_tasks(tasks)):
        raise PosencError(
            f"--tasks {', '.join(ruler)}: RULER sizes its prompts with a Hugging Face tokenizer, which a posenc train "
            "run has not: give --tokenizer DIR (a saved Hugging Face tokenizer)"
        )
    out = Path(out)
    check_run_dir(out)  # a file in the way: refused before any model loads
    hold_run_dir(out)  # before its cells are read (posenc.store.lock)
    refuse_run_dir(out, "harness")
    for kept in sorted((out / "cells").glob("*.json")):
        if (other := read_json(kept).get("dtype", "float32")) != dtype:  # cells before the field were float32
            raise PosencError(f"{out} holds {other} cells ({kept.name}); a {dtype} grid needs another --out")
    started = False  # out made and this call's stamp appended

    def start() -> None:
        nonlocal started
        if not started:
            open_run_dir(out)  # held from here (posenc.store.lock)
            make_run_dir(out / "cells")
            stamp = {"model": model, "tasks": tasks, "lengths": lengths, **run_stamp()}
            append_jsonl(out / "invocations.jsonl", stamp)
            started = True

    cells = {}
    for adaptation in adaptations:
        lm = None
        for task in tasks:
            for length in lengths:
                path = out / "cells" / cell_name(adaptation, task, length)
                if not path.exists():
                    if lm is None:
                        lm = PosencLM(pretrained=model, **args[adaptation])
                        start()
                        tokenizer = tokenizer or _saved_tokenizer(lm, out / "tokenizer")
                    cache = out / "cache" / path.stem
                    record = {"adaptation": adaptation, "task": task, "length": length, "limit": limit, "dtype": dtype}
                    write_json(path, record | run_cell(lm, task, length, limit, cache, tokenizer))
                cells[adaptation, task, length] = read_json(path)
    start()  # every cell was kept: the call is stamped all the same
    return write_table(cells, tasks, lengths, adaptations, out)


@functools.cache
def task_index() -> dict:
    """lm-eval's index of its tasks, groups and tags: {name: entry} (built once per process, seconds)."""
    from lm_eval.tasks import TaskManager

    return TaskManager().task_index


def ruler_tasks(tasks: list[str]) -> list[str]:
    """Those of ``tasks`` that are RULER's (defined under lm-eval's ``tasks/ruler``: the tasks and the group), which
    generate their prompts with a Hugging Face tokenizer."""
    index = task_index()
    return [t for t in tasks if t in index and "ruler" in Path(str(index[t].yaml_path)).parts]


def check_tokenizer(tokenizer: str) -> None:
    """PosencError (one line) when ``tokenizer`` (``--tokenizer``: a directory or a hub id) is no Hugging Face
    tokenizer transformers can load: a missing path, a directory without one."""
    from transformers import AutoTokenizer

    if not Path(tokenizer).expanduser().exists() and not loading.is_hub_id(tokenizer):
        raise PosencError(f"--tokenizer {tokenizer} does not exist (a directory or a Hugging Face hub id ORG/NAME)")
    try:
        AutoTokenizer.from_pretrained(tokenizer)
    except (OSError, ValueError) as exc:
        if Path(tokenizer).expanduser().is_dir():  # transformers' own words end mid-sentence ("from one of:")
            raise PosencError(
                f"--tokenizer {tokenizer} holds no Hugging Face tokenizer transformers can load (tokenizer.json, "
                "tokenizer_config.json with its vocabulary): give the directory a model's tokenizer was saved to"
            ) from None
        raise PosencError(f"--tokenizer {tokenizer} is no Hugging Face tokenizer ({first_line(exc)})") from None


def _saved_tokenizer(lm: PosencLM, where: Path) -> str | None:
    """The directory of ``lm``'s Hugging Face tokenizer, saved there once (RULER loads it by name: a GGUF's cannot
    be), or None for a posenc train run's."""
    if lm.kind == "train":
        return None
    if not (where / "tokenizer_config.json").exists():
        lm.backend.tokenizer.save_pretrained(str(where))
    return str(where)


def write_table(cells: dict, tasks: list[str], lengths: list[int], adaptations: list[str], out: Path) -> str:
    """``out/table.md`` and ``table.csv`` (a row per adaptation, a column per task and length: score, 95% Wilson
    interval, n) and ``out/plot.png`` (a panel per task: score against length, a line per adaptation with its
    interval); returns the markdown."""
    columns = [(t, n) for t in tasks for n in lengths]
    rows, csv = [], []
    for a in adaptations:
        row = [a]
        for t, n in columns:
            c = cells[a, t, n]
            row.append(f"{c['score']:.2f} [{c['low']:.2f}, {c['high']:.2f}] (n={c['n']})")
            csv.append([a, t, n, c["metric"], c["score"], c["low"], c["high"], c["n"]])
        rows.append(row)
    dtypes = sorted({c.get("dtype", "float32") for c in cells.values()})  # cells before the field were float32
    text = (
        "Score per task and length (lm-eval's metric, per-sample mean), its 95% Wilson interval and the number of "
        f"samples n; weights and compute in {', '.join(dtypes)}.\n\n"
        + markdown_table(["adaptation", *(f"{t} @ {n}" for t, n in columns)], rows)
    )
    atomic_write_bytes(out / "table.md", text.encode())
    write_csv_table(out / "table.csv", ["adaptation", "task", "length", "metric", "score", "low", "high", "n"], csv)
    fig, axes = figure(1, len(tasks), figsize=(4.5 * len(tasks), 3.5), squeeze=False)
    for ax, t in zip(axes[0], tasks):
        for a in adaptations:
            c = [cells[a, t, n] for n in lengths]
            y = [x["score"] for x in c]
            err = [[v - x["low"] for v, x in zip(y, c)], [x["high"] - v for v, x in zip(y, c)]]
            ax.errorbar(lengths, y, yerr=err, marker="o", capsize=3, label=a)
        ax.set(title=t, xlabel="length (tokens)", ylabel="score", xscale="log", ylim=(-0.05, 1.05))
        ax.set_xticks(lengths, [str(n) for n in lengths])
    axes[0][0].legend(fontsize=7)
    save_figure(fig, out / "plot.png")
    return text
