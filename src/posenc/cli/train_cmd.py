"""`posenc train`: train one model with one scheme (one process, or data-parallel under torchrun)."""

import dataclasses
import os
import shutil
from pathlib import Path

from posenc.cli.common import (
    OUT,
    add_dry_run,
    add_set,
    given_settings,
    nonblank,
    print_dry_run,
    refuse_derived_settings,
)
from posenc.config.plan import load_preset
from posenc.data.corpora import check_data
from posenc.errors import PosencError
from posenc.model import check_batch_fits
from posenc.store.checkpoint import check_run_dir, read_json
from posenc.store.lock import hold_run_dir, holds, run_files
from posenc.store.stamp import run_stamp
from posenc.train import distributed
from posenc.train.batches import check_positions, check_task_settings
from posenc.train.loop import check_model_seed, train
from posenc.train.precision import resolve_precision
from posenc.train.resume import checkpoint_step
from posenc.train.rundir import check_resume, is_trained, read_run_config, steps_to_criterion
from posenc.train.settings import PRECISIONS
from posenc.train.signals import StopNow
from posenc.train.tracking import KINDS, check_kind, open_tracker


def add_parser(sub):
    p = sub.add_parser("train", help="train one language model with one positional scheme")
    p.add_argument("--scheme", required=True, help="scheme name (see `posenc list`)")
    p.add_argument(
        "--preset", default="default", help="preset for model and budget (a preset name (posenc list) or a path)"
    )
    p.add_argument("--out", type=OUT, help="run directory (default runs/train/<scheme>)")
    p.add_argument("--corpus", type=nonblank(), help="corpus: shakespeare, pystdlib, hf:NAME, or a path")
    p.add_argument("--tokenizer", help="byte or bpeN")
    p.add_argument("--steps", type=int, help="training steps")
    p.add_argument("--batch-size", type=int, help="global batch size (split evenly over torchrun processes)")
    p.add_argument("--seed", type=int, help="random seed")
    p.add_argument("--time-budget", type=float, help="stop after this many seconds")
    p.add_argument("--resume", action="store_true", help="continue from the run directory's checkpoint")
    p.add_argument("--compile", action="store_true", default=None, help="torch.compile the model (train.compile)")
    p.add_argument(
        "--precision",
        choices=PRECISIONS,
        help="compute dtype (train.precision): auto picks bf16 where the device has bf16 units",
    )
    p.add_argument(
        "--device",
        type=nonblank(),
        help="where to train: cpu, cuda, cuda:N or mps (default: the GPU when there is one, else cpu); "
        "recorded in the run's stamp (config.json)",
    )
    add_dry_run(p, "training")
    add_set(p, "train.lr=3e-3 or model.n_layer=2")
    p.add_argument(
        "--log",
        choices=KINDS,
        default=os.environ.get("POSENC_LOG", "none"),
        help="experiment tracking: TensorBoard event files or a W&B run "
        "(WANDB_MODE=offline: no network) in the run directory (default none, or $POSENC_LOG: how compare passes it "
        "through torchrun)",
    )
    p.set_defaults(func=run)


# each flag of a preset setting: the key it sets (as --set KEY=VALUE does)
FLAGS = {
    k: f"train.{k}"
    for k in ("corpus", "tokenizer", "steps", "batch_size", "seed", "time_budget", "compile", "precision")
}


def run(args) -> int:
    settings = given_settings(args, FLAGS)
    refuse_derived_settings(settings, "train", "--scheme")
    unread = sorted({key.split(".")[0] for key in settings} - {"model", "train"})
    if unread:  # the preset's other sections are compare's: a value given there would change nothing
        raise PosencError(
            f"--set {unread[0]}: train reads the model and train settings only ({unread[0]} is posenc compare's; a "
            "task trains with --corpus TASK)"
        )
    preset = load_preset(args.preset, settings, schemes=[args.scheme])  # checks the scheme
    mcfg = dataclasses.replace(preset.model, encoding=args.scheme)
    out = args.out or Path("runs") / "train" / args.scheme
    check_run_dir(out)  # a file in the way: refused before the work, by the dry run too
    if not args.dry_run and distributed.rank() == 0:  # before reading what it holds; rank 0 holds it for all
        hold_run_dir(out, ancestors=True)
    if (out / "preset.json").exists():  # the two would share one folder, each reading the other's files
        raise PosencError(f"{out} holds a posenc compare run (preset.json): give train another --out")
    if not args.resume and (out / "model.safetensors").exists():
        raise PosencError(f"{out} already holds a run; pass --resume to continue it, or choose another --out")
    if not args.resume and out.is_dir() and not (out / "config.json").exists() and run_files(out):  # as finetune
        raise PosencError(
            f"{out} holds files but no train run (config.json); --out is the run directory itself: give a new or "
            "empty one"
        )
    if args.resume and not (out / "config.json").exists():  # a mistyped --out would start a fresh run silently
        raise PosencError(f"--resume: {out} holds no run to resume (no config.json); drop --resume to start one there")
    check_kind(args.log)
    device = distributed.check_device(args.device) if args.device else distributed.default_device()
    check_positions(mcfg, preset.train)
    check_model_seed(mcfg, preset.train)
    check_task_settings(preset.train)
    check_data(preset.train.corpus, preset.train.tokenizer)  # what the run refuses, before --dry-run prints it valid
    precision = resolve_precision(preset.train.precision, device)
    if args.dry_run:
        batch = preset.train.batch_size  # a run checks it in train, after the model's size (check_fits)
        check_batch_fits(mcfg, batch, max(1, batch // distributed.world_size()), device)
        if (
            args.resume and (out / "state.pt").exists()
        ):  # what train refuses on resume; the vocabulary is the recorded run's (corpus compared)
            vocab = read_run_config(out)["model"].get("vocab_size", mcfg.vocab_size)
            check_resume(
                out,
                dataclasses.replace(mcfg, vocab_size=vocab, seed=preset.train.seed),
                preset.train.model_copy(update={"precision": precision}),
                checkpoint_step(out),
            )
        settings = {"scheme": args.scheme, "out": out, "device": device, "precision": precision}
        steps = preset.train.last_step()
        what = "resumed from its checkpoint" if args.resume else "a new run"
        return print_dry_run(
            "posenc train",
            {**settings, "model": dataclasses.asdict(mcfg), "train": preset.train.model_dump()},
            1,
            f"one training run, {what}, of at most {steps} steps",
        )
    config = {
        "name": out.name,
        "scheme": args.scheme,
        "model": dataclasses.asdict(mcfg),
        "train": preset.train.model_dump(),
        "stamp": run_stamp(precision, device),
    }
    before = read_json(out / "train_summary.json") if is_trained(out) else None  # finished: train keeps it as it is
    finished = before is not None and (
        before["steps"] == preset.train.steps or steps_to_criterion(before) == before["steps"]
    )
    fresh = not out.exists()
    try:
        with open_tracker(
            args.log if distributed.rank() == 0 else "none", out, f"{out.name}/{args.scheme}", "train", config
        ) as tracker:
            summary = train(out, mcfg, preset.train, resume=args.resume, tracker=tracker, device=device)
    except PosencError:
        if fresh and holds(out) and not (out / "state.pt").exists():  # refused before its first checkpoint
            shutil.rmtree(out, ignore_errors=True)  # the folder this call made: nothing of a run is left half-made
        raise
    except (StopNow, KeyboardInterrupt) as exc:
        if not (out / "config.json").exists():  # stopped before the run's first write: --resume would be refused
            raise KeyboardInterrupt(f"{out} holds no checkpoint yet (the same command starts it again)") from None
        if isinstance(exc, StopNow):  # a second Ctrl-C: no new checkpoint
            raise KeyboardInterrupt(f"stopped at once; {out} keeps its last checkpoint", "--resume") from None
        raise KeyboardInterrupt(str(exc) or f"{out} keeps its last checkpoint", "--resume") from None
    finally:
        distributed.teardown()
    if distributed.rank() == 0 and finished:
        print(f"{out} is already trained (step {summary['steps']} of {preset.train.steps}): nothing left to do")
    elif distributed.rank() == 0:
        met = steps_to_criterion(summary)
        left = (
            met is None and summary["steps"] < preset.train.steps
        )  # the time budget stopped it: say so, and how to go on
        loss = "n/a" if summary["final_loss"] is None else f"{summary['final_loss']:.4f}"
        stop = f" (time budget {preset.train.time_budget:g} s reached; --resume continues)" if left else ""
        stop = f" (met train.until: {preset.train.until.describe()})" if met is not None else stop
        print(
            f"trained {args.scheme}: step {summary['steps']} of {preset.train.steps}, "
            f"{summary['seconds']:.0f} s in this call, final loss {loss} -> {out}{stop}"
        )
    return 0
