"""``posenc finetune``: fine-tune a pretrained RoPE model after a scheme swap or a RoPE schedule, scored before and after.

The job is ``posenc.finetune``; presets are ``posenc/configs/finetune/*.yaml``.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from posenc.finetune import FinetuneConfig, finetune, load_preset, preset_names
from posenc.rope import NAMES
from posenc.tracking import KINDS
from posenc.train import StopNow

BUDGET_NOTE = """\
Budget (SmolLM2-135M, measured): a LoRA step of 1K tokens takes ~10 s on an idle 2-core machine
(--threads 2), 15-40 s on one thread beside another job; the default (50 steps, 4 scoring windows
before and after) takes 10-15 minutes on the idle machine. --preset quick (5 steps of 256 tokens)
is a smoke test. Ctrl-C ends the step in flight and checkpoints; a rerun resumes (also after a
kill, from the last --ckpt-every checkpoint)."""


def add_parser(sub) -> None:
    p = sub.add_parser("finetune", help="fine-tune a pretrained RoPE model after a scheme swap or RoPE schedule",
                       description=__doc__.splitlines()[0] + "\n\n" + BUDGET_NOTE,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--preset", default="default", help=f"a preset ({', '.join(preset_names())}) or a YAML path")
    p.add_argument("--model", help="'smollm2' (default), a .gguf file, a model directory or a hub id")
    p.add_argument("--scheme", help="posenc scheme put into the model's attention (posenc.hf.apply_scheme; "
                   "default acc-rand-qk)")
    p.add_argument("--method", help=f"or a RoPE context-extension method ({', '.join(NAMES)}) instead of a scheme")
    p.add_argument("--factor", type=float, help="the method's scale factor s (default 2)")
    p.add_argument("--corpus", help="corpus spec (default shakespeare): trains on its training documents")
    p.add_argument("--length", type=int, help="tokens per training sequence (default 1024)")
    p.add_argument("--steps", type=int, help="training steps (default 50)")
    p.add_argument("--batch-size", type=int, help="sequences per step (default 1)")
    p.add_argument("--lr", type=float, help="peak learning rate (default 2e-4; warmup then cosine)")
    p.add_argument("--warmup", type=int, help="warmup steps (default 5)")
    p.add_argument("--lora-rank", type=int, help="LoRA rank (default 8); 0: train every weight")
    p.add_argument("--lora-alpha", type=float, help="LoRA alpha (default 16)")
    p.add_argument("--lora-targets", nargs="+", metavar="MODULE", help="LoRA target modules (default q/k/v/o_proj)")
    p.add_argument("--seed", type=int, help="seed of batches, LoRA initialisation and passkey keys (default 0)")
    p.add_argument("--ckpt-every", type=int, help="checkpoint every N steps (default 10)")
    p.add_argument("--eval-lengths", type=int, nargs="+", help="scoring lengths in tokens (default 1024)")
    p.add_argument("--eval-windows", type=int, help="windows per scoring length; 0 = all (default 4)")
    p.add_argument("--docs", nargs="+", help="held-out document names, 'all' or 'first' (default)")
    p.add_argument("--passkey-lengths", type=int, nargs="*", help="passkey prompt lengths (default none)")
    p.add_argument("--passkey-depths", type=float, nargs="+", help="key depths in [0, 1] (default 0.5)")
    p.add_argument("--trials", type=int, help="passkey trials per (length, depth) cell (default 1)")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--name", help="run name (default: the preset's name)")
    p.add_argument("--out", type=Path, help="output directory (default runs/finetune/<name>)")
    p.add_argument("--log", choices=KINDS, default="none", help="experiment tracking: TensorBoard event files or a W&B run "
                   "(WANDB_MODE=offline: no network) in the output directory (default none)")
    p.set_defaults(func=run)


def config(args) -> FinetuneConfig:
    """The preset named by ``--preset`` with every given flag replacing its value; a given ``--method``
    replaces the preset's scheme (and ``--scheme`` its method): one adaptation per run."""
    given = {k: v for k, v in vars(args).items() if k in FinetuneConfig.model_fields and v is not None}
    if args.method is not None and args.scheme is None:
        given["scheme"] = None
    if args.scheme is not None and args.method is None:
        given["method"] = "none"
    return load_preset(args.preset, given)


def run(args) -> int:
    try:
        out, markdown = finetune(config(args), args.out, log=args.log)
    except StopNow:  # a second Ctrl-C: no new checkpoint
        raise KeyboardInterrupt("stopped at once; the run keeps its last checkpoint") from None
    except KeyboardInterrupt as exc:  # cli prints it with the command that resumes (the same one)
        raise KeyboardInterrupt(str(exc) or "the run keeps its last checkpoint and records") from None
    print(markdown)
    print(f"results in {out}/")
    return 0
