"""``posenc finetune``: fine-tune a pretrained RoPE model after a scheme swap or a RoPE schedule, scored before \
and after.

The job is ``posenc.jobs.finetune``; presets are ``posenc/presets/finetune/*.yaml``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from posenc.cli.common import OUT, add_dry_run, add_set, given_settings, nonblank, print_dry_run, shown
from posenc.cli.extend_cmd import add_factor_lists, factor_lists, flag_keys
from posenc.hf.loading import check_pretrained
from posenc.jobs.extend import held_out
from posenc.jobs.finetune import (
    FinetuneConfig,
    check_dependencies,
    check_resumable,
    eval_config,
    finetune,
    load_finetune_config,
    preset_names,
)
from posenc.rope import NAMES
from posenc.train.signals import StopNow
from posenc.train.tracking import KINDS

BUDGET_NOTE = """\
Budget (SmolLM2-135M, measured): a LoRA step of 1K tokens takes ~10 s on an idle 2-core machine
(--threads 2), 15-40 s on one thread beside another job; the default (50 steps, 4 scoring windows
before and after) takes 10-15 minutes on the idle machine. --preset quick (--quick; 5 steps of 256 tokens,
~2.3 s a step on one free core, about a minute in all) is a smoke test; `posenc generate RUN_DIR` continues a
prompt with the fine-tuned model. Ctrl-C ends the step in flight and checkpoints; a rerun resumes (also after a
kill, from the last --ckpt-every checkpoint)."""


def add_parser(sub) -> None:
    d = load_finetune_config(
        "default"
    )  # what a flag left out takes: the default preset, over FinetuneConfig's defaults
    p = sub.add_parser(
        "finetune",
        help="fine-tune a pretrained RoPE model after a scheme swap or RoPE schedule",
        description=__doc__.splitlines()[0] + "\n\n" + BUDGET_NOTE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    mode = p.add_mutually_exclusive_group()  # as posenc extend's
    mode.add_argument("--preset", help=f"a preset ({', '.join(preset_names())}) or a YAML path (default: default)")
    mode.add_argument("--quick", action="store_true", help="--preset quick: 5 steps of 256 tokens, smoke test")
    p.add_argument(
        "--model", type=nonblank(), help=f"'smollm2', a .gguf file, a model directory or a hub id (default {d.model})"
    )
    p.add_argument(
        "--scheme",
        help=f"posenc scheme put into the model's attention (posenc.hf.scheme.apply_scheme; default {shown(d.scheme)})",
    )
    p.add_argument("--schedule", help=f"or a RoPE context-extension schedule ({', '.join(NAMES)}) instead of a scheme")
    p.add_argument("--factor", type=float, help=f"the schedule's scale factor s (default {shown(d.factor)})")
    add_factor_lists(p)
    p.add_argument(
        "--corpus", type=nonblank(), help=f"corpus spec (default {d.corpus}): trains on its training documents"
    )
    p.add_argument("--length", type=int, help=f"tokens per training sequence (default {d.length})")
    p.add_argument("--steps", type=int, help=f"training steps (default {d.steps})")
    p.add_argument("--batch-size", type=int, help=f"sequences per step (default {d.batch_size})")
    p.add_argument("--lr", type=float, help=f"peak learning rate (default {shown(d.lr)}; warmup then cosine)")
    p.add_argument("--warmup", type=int, help=f"warmup steps (default {d.warmup})")
    p.add_argument(
        "--pose-target",
        type=int,
        metavar="TOKENS",
        help="PoSE (Zhu et al. 2024): train with position ids "
        "skipping over a context of TOKENS (chunks of each sequence shifted; native RoPE or a schedule)",
    )
    p.add_argument("--pose-chunks", type=int, help=f"PoSE's chunks per training sequence (default {d.pose_chunks})")
    p.add_argument("--lora-rank", type=int, help=f"LoRA rank (default {d.lora_rank}); 0: train every weight")
    p.add_argument("--lora-alpha", type=float, help=f"LoRA alpha (default {shown(d.lora_alpha)})")
    p.add_argument(
        "--lora-targets", nargs="+", metavar="MODULE", help=f"LoRA target modules (default {shown(d.lora_targets)})"
    )
    p.add_argument("--seed", type=int, help=f"seed of batches, LoRA initialisation and passkey keys (default {d.seed})")
    p.add_argument("--ckpt-every", type=int, help=f"checkpoint every N steps (default {d.ckpt_every})")
    p.add_argument(
        "--eval-lengths", type=int, nargs="+", help=f"scoring lengths in tokens (default {shown(d.eval_lengths)})"
    )
    p.add_argument("--eval-windows", type=int, help=f"windows per scoring length; 0 = all (default {d.eval_windows})")
    p.add_argument("--docs", nargs="+", help=f"held-out document names, 'all' or 'first' (default {shown(d.docs)})")
    p.add_argument(
        "--passkey-lengths",
        type=int,
        nargs="*",
        help=f"passkey prompt lengths (default {shown(d.passkey_lengths)}; the bare flag, no lengths: no passkey)",
    )
    p.add_argument(
        "--passkey-depths", type=float, nargs="+", help=f"key depths in [0, 1] (default {shown(d.passkey_depths)})"
    )
    p.add_argument("--trials", type=int, help=f"passkey trials per (length, depth) cell (default {d.trials})")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--name", help="run name (default: the preset's name)")
    p.add_argument(
        "--out",
        type=OUT,
        help="run directory (default runs/finetune/<name>); "
        "a run of the same settings resumes; other files there are refused",
    )
    add_set(p, "lora_alpha=32 or eval_lengths=[512,1024] (the keys are the flags': --lora-rank is lora_rank)")
    p.add_argument(
        "--log",
        choices=KINDS,
        default="none",
        help="experiment tracking: TensorBoard event files or a W&B run "
        "(WANDB_MODE=offline: no network) in the output directory (default none)",
    )
    add_dry_run(p, "loading the model, training or scoring")
    p.set_defaults(func=run)


def config(args) -> FinetuneConfig:
    """The preset named by ``--preset`` (or ``--quick``) with every given flag replacing its value; a given
    ``--schedule`` replaces the preset's scheme (and ``--scheme`` its schedule): one adaptation per run."""
    derived = factor_lists(args)
    if args.schedule is not None and args.scheme is None:
        derived["scheme"] = None
    if args.scheme is not None and args.schedule is None:
        derived["schedule"] = "none"
    return load_finetune_config(
        args.preset or ("quick" if args.quick else "default"),
        given_settings(args, flag_keys(args, FinetuneConfig), derived),
    )


def dry_run(args, cfg: FinetuneConfig) -> int:
    """``--dry-run``: the settings and the one job, after the checks a run makes before the model loads (missing
    packages, a run directory of other settings, the document names)."""
    out = args.out or Path("runs") / "finetune" / cfg.name
    check_dependencies(cfg)
    check_resumable(out, cfg)
    held_out(eval_config(cfg))
    check_pretrained(cfg.model)  # a missing path or a posenc run, as loading it refuses it
    windows = f"{cfg.eval_windows} window(s)" if cfg.eval_windows else "every window"
    trials = len(cfg.passkey_lengths) * len(cfg.passkey_depths) * cfg.trials
    detail = (
        f"one fine-tuning run of {cfg.steps} steps of {cfg.batch_size} x {cfg.length} tokens, scored before and "
        f"after on {windows} at lengths {shown(cfg.eval_lengths)}; {trials} passkey trial(s)"
    )
    return print_dry_run("posenc finetune", {"out": out, **cfg.model_dump()}, 1, detail)


def run(args) -> int:
    cfg = config(args)
    if args.dry_run:
        return dry_run(args, cfg)
    out = args.out or Path("runs") / "finetune" / cfg.name
    try:
        out, markdown = finetune(cfg, out, log=args.log)
    except (StopNow, KeyboardInterrupt) as exc:  # cli prints it with the command that resumes (the same one)
        if not out.is_dir():  # stopped before the run directory was made (loading the model): nothing to keep
            raise KeyboardInterrupt() from None
        if isinstance(exc, StopNow):  # a second Ctrl-C: no new checkpoint
            raise KeyboardInterrupt(f"stopped at once; {out} keeps its last checkpoint") from None
        raise KeyboardInterrupt(str(exc) or f"{out} keeps its last checkpoint and records") from None
    print(markdown)
    print(f"results in {out}/")
    return 0
