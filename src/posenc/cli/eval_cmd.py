"""`posenc eval RUN_DIR`: perplexity against evaluation length for one trained run."""

import json
import math
import re
import time
from pathlib import Path

import numpy as np
import torch

from posenc.cli.common import nonblank, number_list, once
from posenc.data.positions import scored_max
from posenc.errors import PosencError
from posenc.eval.passkey import PasskeyConfig, passkey_records
from posenc.eval.perplexity import evaluate_length, stream_buckets
from posenc.model import set_method, with_rope_schedule
from posenc.reports.render import plot_stream
from posenc.rope import SCHEDULES, check_window
from posenc.scoring import eval_lengths, plan
from posenc.store.checkpoint import drop_torn_tail
from posenc.store.lock import hold_run_dir
from posenc.store.records import Ppl, append
from posenc.train.batches import randomized_max
from posenc.train.rundir import load_text_run, run_tokens

MULTIPLES, MAX_TOKENS = (1, 2, 4, 8, 16, 32, 64), 32768


def add_parser(sub):
    p = sub.add_parser("eval", help="evaluate a trained run: perplexity vs evaluation length")
    p.add_argument("run_dir", type=nonblank(Path))
    p.add_argument(
        "--multiples",
        type=int,
        nargs="+",
        help=f"lengths as multiples of the training length (default {' '.join(map(str, MULTIPLES))})",
    )
    p.add_argument("--max-tokens", type=int, help=f"scored tokens per length (default {MAX_TOKENS})")
    p.add_argument("--corpus", type=nonblank(), help="evaluate on another corpus's held-out documents")
    p.add_argument(
        "--passkey",
        choices=["rank", "generate"],
        help="also passkey retrieval at 1x and 4x: by log-probability rank, or by greedy generation of the key",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print one JSON object instead of the tables: the same numbers, unrounded, and nothing else on stdout",
    )
    g = p.add_argument_group("RoPE context extension (RoPE runs only, no retraining)")
    g.add_argument("--rope-schedule", metavar="NAME", help=", ".join(SCHEDULES))
    g.add_argument("--factor", type=float, help="scale factor s (pi, ntk, dynamic, yarn, llama3)")
    g.add_argument("--rerope-window", type=int, help="ReRoPE window w (tokens)")
    g.add_argument("--leak", type=float, help="leaky ReRoPE k > 1: positions beyond w become w + (i-j-w)/k")
    g.add_argument(
        "--short-factor", metavar="F1,F2,...", help="longrope: D/2 comma-separated factors up to the training length"
    )
    g.add_argument("--long-factor", metavar="F1,F2,...", help="longrope: D/2 comma-separated factors past it")
    g.add_argument(
        "--rope-param",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="other schedule parameters, e.g. beta_fast=32 attention_factor=1.2 truncate=false",
    )
    m = p.add_argument_group("long-context methods (rope with fixed frequencies, alibi, t5, kerple; no retraining)")
    m.add_argument(
        "--method",
        metavar="SPEC",
        help="self-extend:group=G,window=W | lm-infinite:n_global=N,window=W | "
        "sinks:n_sink=N,window=W | dual-chunk:chunk=S,local=W (defaults from the training length; with "
        "--rope-schedule, on top of it)",
    )
    m.add_argument(
        "--stream",
        type=int,
        metavar="TOKENS",
        help="with --method sinks: instead of the lengths, the perplexity of "
        "the first TOKENS targets of the held-out documents (joined in order) streamed through the bounded cache, "
        "per eighth of the text, and the cache's peak size",
    )
    p.set_defaults(func=run)


def _value(text: str):
    """A --rope-param value: true/false, an integer (``original_max_position_embeddings=4096``) or a float."""
    if text.lower() in ("true", "false"):
        return text.lower() == "true"
    try:
        return int(text) if text.strip().lstrip("+-").isdigit() else float(text)
    except ValueError:
        raise PosencError(f"--rope-param value {text!r} is not a number or true/false") from None


def schedule_args(args) -> dict:
    """Schedule parameters from --factor/--rerope-window/--leak/--short-factor/--long-factor/--rope-param."""
    params = {"factor": args.factor, "window": args.rerope_window, "leak": args.leak}
    params.update(
        (k, number_list(f"--{k.replace('_', '-')}", getattr(args, k)))
        for k in ("short_factor", "long_factor")
        if getattr(args, k) is not None
    )
    for item in args.rope_param:
        key, sep, val = item.partition("=")
        if not sep:
            raise PosencError(f"--rope-param expects KEY=VALUE, got {item!r}")
        key = key.replace("-", "_")
        if params.get(key) is not None:  # a flag and a --rope-param, or one --rope-param twice: one would be dropped
            raise PosencError(f"--rope-param {item}: {key} is given twice (a flag or another --rope-param sets it)")
        params[key] = _value(val)
    return params


def scored_text(docs: list, corpus: str, span: int, max_tokens: int) -> str:
    """One line naming the text every length scores (the first ``span`` targets of the documents used) and its
    size, saying so when it is not ``max_tokens`` targets. PosencError as ``posenc.scoring.plan``."""
    wins = plan(docs, span, max_tokens, span=span)
    used = [docs[d][0] for d in dict.fromkeys(d for d, _ in wins)]
    scored = sum(w.n_scored for _, w in wins)
    line = (
        f"text: the first {span} targets of {len(used)} held-out document(s) of {corpus} ({', '.join(used)}), "
        f"{scored} targets per length"
    )
    if scored < max_tokens:  # every document long enough is used, each for its first span targets only
        rest = len(docs) - len(used)
        why = f"the other {rest} have fewer than {span + 1} tokens" if rest else f"all {len(docs)} are used"
        line += (
            f", fewer than --max-tokens {max_tokens}: each held-out document gives its first {span} targets only "
            f"(every length scores the same text), and {why}"
        )
    elif scored > max_tokens:
        line += f", more than --max-tokens {max_tokens}: whole spans of the longest length"
    return (
        line + f" (posenc compare scores this text when its longest length is {span} and its max_tokens {max_tokens})"
    )


def run(args) -> int:
    given = [args.factor, args.rerope_window, args.leak, args.short_factor, args.long_factor, *args.rope_param]
    if not args.rope_schedule and any(v is not None for v in given):  # else silently ignored
        raise PosencError(
            "--factor/--rerope-window/--leak/--short-factor/--long-factor/--rope-param need --rope-schedule"
        )
    if args.stream is not None and (args.multiples or args.max_tokens) is not None:  # the stream ignores them
        raise PosencError("--stream scores one stream of its own length: --multiples and --max-tokens do not apply")
    args.multiples = args.multiples or list(MULTIPLES)
    args.max_tokens = MAX_TOKENS if args.max_tokens is None else args.max_tokens
    once("--multiples", args.multiples)  # each length is scored once, and its record appended to eval.jsonl once
    model, mcfg, tcfg = load_text_run(args.run_dir, "eval")
    # its eval.jsonl: one writer at a time (posenc.store.lock); a read-only run is refused naming the folder
    hold_run_dir(args.run_dir, fix="", ancestors=True, writes="its records (eval.jsonl)")
    drop_torn_tail(Path(args.run_dir) / "eval.jsonl")  # a record a kill cut short must not swallow the next one
    lengths = eval_lengths(mcfg.train_length, args.multiples)
    scheme = mcfg.encoding
    if args.rope_schedule:
        model, scheme = with_rope_schedule(model, args.rope_schedule, schedule_args(args))
        check_window(model.blocks[0].attn.enc.schedule_params, min(lengths))
    method = set_method(model, args.method)
    base = {"scheme": scheme}
    if method is not None:
        scheme = base["scheme"] = f"{scheme}+{method.describe()}"
        base["method"] = method.label()
    corpus = args.corpus or tcfg.corpus
    data = run_tokens(args.run_dir, tcfg, corpus)
    text = scored_text(
        data.val_docs, corpus, max(lengths), args.max_tokens
    )  # bad --max-tokens, short text: before any output
    if args.stream is not None:
        return stream(args, model, data, base, corpus)
    doc = {"run": str(args.run_dir), "scheme": scheme, "text": text, "train_length": mcfg.train_length}
    say = _printer(args)
    say(f"scheme: {scheme}\n{text}")
    drawn = randomized_max(tcfg.positions)
    if drawn is not None:
        doc["positions"] = f"positions: {tcfg.positions}, " + (
            "scored on a seeded draw of each window's positions (as trained)"
            if scored_max(model, drawn)
            else "scored on 0..T-1 (a method or schedule keeps the positions in order)"
        )
        say(doc["positions"])
    records = []
    for L in lengths:
        run = {**base, "corpus": corpus}  # the record names the text it scored (--corpus: not the training one)
        rec = evaluate_length(model, data.val_docs, L, run, args.max_tokens, span=max(lengths), positions=drawn)
        append(Path(args.run_dir) / "eval.jsonl", rec)
        records.append(rec)
    # after every length, so the ratio does not depend on where the training length comes in --multiples
    ref = next((rec.ppl for L, rec in zip(lengths, records) if L == mcfg.train_length), None)
    say(f"{'length':>8} {'windows':>8} {'tokens':>8} {'ppl':>10} {'ratio':>7}")
    doc["lengths"] = []
    for L, rec in zip(lengths, records):
        row = {"length": L, "windows": rec.windows, "scored_tokens": rec.scored_tokens, "ppl": rec.ppl}
        doc["lengths"].append(row)
        if rec.ppl is None:
            row["note"] = rec.note.removeprefix("n/a: ")
            say(f"{L:>8} {'':>8} {'':>8} {'n/a':>10}  {row['note']}")
            continue
        row["ratio"] = rec.ppl / ref if ref else None  # to the training length's perplexity
        ratio = f"{row['ratio']:7.3f}" if ref else ""
        say(f"{L:>8} {rec.windows:>8} {rec.scored_tokens:>8} {rec.ppl:>10.3f} {ratio}")
    if args.passkey:
        say(f"passkey ({args.passkey}):\n{'length':>8} {'depth':>6} {'accuracy':>9}")
        run = {**base, "train_length": mcfg.train_length}
        doc["passkey"] = {"mode": args.passkey, "cells": []}
        for rec in passkey_records(model, data.tokenizer, PasskeyConfig(mode=args.passkey), run):
            append(Path(args.run_dir) / "eval.jsonl", rec)
            doc["passkey"]["cells"].append(
                {k: getattr(rec, k) for k in ("length", "depth", "correct", "trials", "accuracy", "note")}
            )
            acc = rec.note if rec.accuracy is None else f"{rec.correct}/{rec.trials}"
            say(f"{rec.length:>8} {rec.depth:>6g} {acc:>9}")
    if args.json:
        print(json.dumps(doc, indent=1))
    return 0


def _printer(args):
    """print for the tables; with --json nothing (the JSON object, printed at the end, is stdout's only output)."""

    def say(*lines: str) -> None:
        if not args.json:
            print(*lines)

    return say


def stream(args, model, data, base: dict, corpus: str) -> int:
    """``--stream``: one long text through the bounded cache (``LM.streaming_nll``), one Ppl record (scheme label
    ``... streamed``, ``eval_length`` the scored targets, eight position buckets, the peak cache in ``note``)."""
    if args.stream < 1:
        raise PosencError(f"--stream takes the number of targets to score (>= 1), got {args.stream}")
    joined = np.concatenate([ids for _, ids in data.val_docs])[: args.stream + 1]
    text = torch.as_tensor(joined.astype("int64"), device=next(model.parameters()).device)
    t0 = time.time()
    nll, peak = model.streaming_nll(text)
    n = nll.shape[0]
    edges, buckets = stream_buckets(nll.double().numpy())
    note = f"streamed through the bounded cache: peak {peak} bytes" + (
        f"; the held-out text has only {n} targets" if n < args.stream else ""
    )
    rec = Ppl(
        **{**base, "scheme": base["scheme"] + " streamed", "corpus": corpus},
        train_length=model.cfg.train_length,
        eval_length=n,
        windows=1,
        scored_tokens=n,
        nll=float(nll.double().sum()),
        ppl=math.exp(float(nll.double().mean())),
        bucket_edges=edges,
        bucket_ppl=buckets,
        note=note,
        seconds=time.time() - t0,
    )
    append(Path(args.run_dir) / "eval.jsonl", rec)
    plot = plot_stream(
        nll.double().numpy(),
        Path(args.run_dir) / f"stream_{re.sub(r'[^A-Za-z0-9=._-]', '_', base['method'])}.png",
        rec.scheme,
    )
    text_line = f"text: the first {n} targets of the held-out documents of {corpus}, joined in order"
    if args.json:
        buckets_json = [{"from": a, "to": b, "ppl": p} for a, b, p in zip(edges, edges[1:], buckets)]
        doc = {"run": str(args.run_dir), "scheme": rec.scheme, "text": text_line, "targets": n, "ppl": rec.ppl}
        print(json.dumps({**doc, "peak_cache_bytes": peak, "plot": str(plot), "buckets": buckets_json}, indent=1))
        return 0
    print(
        f"scheme: {rec.scheme}\n{text_line}\n"
        f"ppl {rec.ppl:.3f}; peak cache {peak} bytes; per position: {plot}\n{'targets':>16} {'ppl':>10}"
    )
    for a, b, p in zip(edges, edges[1:], buckets):
        print(f"{f'{a}-{b}':>16} {p:>10.3f}")
    return 0
